"""Training throughput of the 7B single-GPU recipe's architecture (GPU hosts only): tokens/s, MFU, peak memory.

    python bench/train_gpu_7b.py [--steps 5] [--batch 4] [--seq 3072] [--peak-tflops 989]

Qwen2.5-7B's architecture (from its published config: hidden 3584, 28 layers, 28 heads / 4 KV
heads, intermediate 18944, vocab 152064) built from a random init in bf16 on one GPU, with the LoRA
adapter of training/configs/simulator_qwen2.5-7b_lora.yaml (r 64, alpha 128, all linear layers),
gradient checkpointing and AdamW, on random token batches of the recipe's shape (4 x 3072). No
weights are downloaded. MFU counts 4 x parameters x tokens (forward, and the backward pass to the
activations; the frozen base gets no weight gradients) plus attention, against --peak-tflops
(989 = H100/H200 dense bf16). Prints one JSON object.

Status: written for GPU hosts; it has NOT been run by the project yet (no GPU was lent to it).
"""

import argparse
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=3072)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    args = parser.parse_args()

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if not torch.cuda.is_available():
        raise SystemExit("bench/train_gpu_7b.py: needs a CUDA GPU")
    config = Qwen2Config(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                         num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
                         rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
    start = time.perf_counter()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    params = sum(p.numel() for p in model.parameters())
    model.gradient_checkpointing_enable()
    model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r=64, lora_alpha=128, lora_dropout=0.05, target_modules="all-linear",
                                             task_type="CAUSAL_LM"))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    build_seconds = time.perf_counter() - start

    batch = torch.randint(0, config.vocab_size, (args.batch, args.seq), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(args.warmup + args.steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - t)
    step_seconds = sum(times) / len(times)
    tokens_per_second = args.batch * args.seq / step_seconds
    attention = 4 * config.num_hidden_layers * config.hidden_size * args.seq  # per token, causal, fwd+bwd-to-input
    flops_per_token = 4 * params + attention
    print(json.dumps({
        "benchmark": "train_gpu_7b", "gpu": torch.cuda.get_device_name(), "parameters": params,
        "trainable_parameters": trainable, "batch": args.batch, "seq": args.seq, "steps": args.steps,
        "build_seconds": round(build_seconds, 1), "step_seconds": round(step_seconds, 3),
        "tokens_per_second": round(tokens_per_second), "mfu": round(flops_per_token * tokens_per_second
                                                                    / (args.peak_tflops * 1e12), 4),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1), "final_loss": round(loss.item(), 3),
    }))


if __name__ == "__main__":
    main()
