"""CPU fine-tuning speed of a real small model (SmolLM2-135M-Instruct) per training variant, side by side.

    python bench/train_cpu.py --model-dir MODEL --dataset-path SFT_SET [--steps 6] [--max-length 768]
                              [--variants full top8 lora lora_top8 top10 top10_fused top10_keep]
                              [--bf16] [--dtype float32|bfloat16]

Each variant runs in a fresh process (so its peak RSS is its own) on the same records of the SFT set's train
split (the first `--steps` + 1 that fit in `--max-length`, chat template applied as training/sft.py does), one
record per step with no padding (what `padding_free` packing gives), AdamW, loss on the completion tokens only.
The first step is warm-up and not timed. `--bf16` and `--dtype bfloat16` are a recipe's `bf16: true` (autocast)
and `dtype: bfloat16` (the weights), the GPU recipes' precision: on a CPU where oneDNN has no bfloat16 (AVX2
without AVX-512) torch multiplies it with its slow fallback kernels, which training/sft.py refuses (docs/training.md).
Variants:

  full        every weight trained (the recipes' full fine-tune)
  topK        full fine-tune of the top K decoder layers and the final norm; embeddings (tied to the LM head)
              and the lower layers frozen, so backward stops at layer L-K
  lora        PEFT LoRA r=16 on every linear layer of every decoder layer
  lora_topK   the same on the top K layers only (PEFT `layers_to_transform`)
  X           the loss from the model's own forward: the full (tokens x 49k vocabulary) logits, then
              cross-entropy (what a plain transformers training loop does)
  X_fused     the loss as the recipes' SFTTrainer computes it: TRL's fused LM head (`add_fused_lm_head`,
              chunked, no full logits), which on a CPU still projects every position
  X_keep      X_fused with the recipe option `logits_only_where_loss` (mirrorapi/training/lm_head.py): only
              the positions whose label carries a loss reach the LM head (~10% of a simulator record's
              tokens at max_length 512, ~2% of a judge record's)

FLOPs per step count the matrix products: forward 2 x params for every input token, backward 2 x params of
the layers gradients flow through (input gradients) plus 2 x the trained weights (weight gradients). The ratio
to `--peak-gflops` (2 AVX2 cores in fp32 FMA: 2 x 8 lanes x 2 FMA units x 2 FLOPs x ~2.3 GHz = ~150) says how
close to the hardware the library gets. Prints one JSON object; `uptime` load is in it, since the machine is
shared.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Every linear layer of a Llama decoder layer (PEFT refuses layers_to_transform with "all-linear").
LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def load_records(dataset_path: str, model_dir: str, max_length: int, count: int) -> list[tuple[list[int], int]]:
    """(input ids, prompt length) of the first `count` train records that fit, tokenized as TRL does."""
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    records = []
    for row in load_from_disk(dataset_path)["train"]:
        ids = tokenizer.apply_chat_template(row["prompt"] + row["completion"], tokenize=True, return_dict=True)
        prompt = tokenizer.apply_chat_template(
            row["prompt"], tokenize=True, add_generation_prompt=True, return_dict=True
        )
        if len(ids["input_ids"]) <= max_length:
            records.append((list(ids["input_ids"]), len(prompt["input_ids"])))
        if len(records) == count:
            break
    return records


def prepare(variant: str, model):
    """Sets requires_grad (or wraps in PEFT) for the variant; returns (model, decoder-layer params gradients
    flow through, decoder-layer params trained, whether the LM head/embedding is trained, trained params)."""
    layers = model.model.layers
    top = (
        int(variant.split("_")[-1 if variant.startswith("lora") else 0].rsplit("top", 1)[1])
        if "top" in variant
        else len(layers)
    )
    trained_layers = list(range(len(layers) - top, len(layers)))
    layer_params = sum(p.numel() for p in layers[0].parameters())
    if variant.startswith("lora"):
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(
            r=16,
            lora_alpha=32,
            lora_dropout=0.0,
            target_modules=LINEAR,
            layers_to_transform=trained_layers,
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, config)
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        return model, layer_params * top, 0, False, trained
    if top < len(layers):
        for param in model.parameters():
            param.requires_grad_(False)
        for index in trained_layers:
            layers[index].requires_grad_(True)
        model.model.norm.requires_grad_(True)
        return model, layer_params * top, layer_params * top, False, layer_params * top
    total = sum(p.numel() for p in model.parameters())  # tied embeddings: the LM head's weight, counted once
    return model, layer_params * top, layer_params * top, True, total


def run_variant(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(REPO))
    from mirrorapi.training.lm_head import logits_only_where_loss

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    records = load_records(args.dataset_path, args.model_dir, args.max_length, args.steps + 1)
    model = AutoModelForCausalLM.from_pretrained(
        args.model_dir, dtype=getattr(torch, args.dtype), attn_implementation="sdpa"
    )
    model.config.use_cache = False
    head = model.lm_head.weight.numel()
    body = sum(p.numel() for p in model.model.layers.parameters())
    fused = args.variant.endswith(("_fused", "_keep"))
    if fused:  # as SFTTrainer patches the model, with the outputs it asks for
        from trl.trainer.utils import add_fused_lm_head

        add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    model, through, trained_body, head_trained, trained = prepare(
        args.variant.removesuffix("_fused").removesuffix("_keep"), model
    )
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    times, tokens, flops = [], 0, 0.0
    for step, (ids, prompt_len) in enumerate(records):
        input_ids = torch.tensor([ids])
        labels = input_ids.clone()
        labels[0, :prompt_len] = -100
        start = time.perf_counter()
        with (
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16),
            logits_only_where_loss(args.variant.endswith("_keep")),
        ):
            out = model(input_ids=input_ids, labels=labels, **({"fused_lm_head": True} if fused else {}))
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - start
        if step == 0:
            continue  # warm-up
        times.append(elapsed)
        tokens += len(ids)
        logit_tokens = len(ids) - prompt_len if args.variant.endswith("_keep") else len(ids)
        flops += 2 * body * len(ids) + 2 * head * logit_tokens  # forward
        flops += 2 * through * len(ids) + 2 * head * logit_tokens  # input gradients
        flops += 2 * trained_body * len(ids) + (2 * head * logit_tokens if head_trained else 0)  # weight gradients
    seconds = sum(times)
    return {
        "variant": args.variant,
        "steps": len(times),
        "seconds_per_step": round(seconds / len(times), 3),
        "tokens_per_second": round(tokens / seconds, 1),
        "mean_tokens_per_step": round(tokens / len(times)),
        "trained_params": trained,
        "gflops_per_second": round(flops / seconds / 1e9, 1),
        "ratio_to_peak": round(flops / seconds / 1e9 / args.peak_gflops, 3),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "final_loss": round(out.loss.item(), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--dataset-path", required=True, help="simulator SFT folder (data/build_simulator_sft.py)")
    parser.add_argument(
        "--variants", nargs="+", default=["full", "top8", "lora", "lora_top8", "top10", "top10_fused", "top10_keep"]
    )
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # one variant, in the child process
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--max-length", type=int, default=768)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (AVX2 has no bf16 FMA: expect slower)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="the weights' dtype")
    parser.add_argument("--peak-gflops", type=float, default=150.0)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args)))
        return
    sys.path.insert(0, str(REPO))
    from mirrorapi.versions import package_versions

    load_before = os.getloadavg()
    results = []
    for variant in args.variants:
        child = [sys.executable, __file__, "--variant", variant, *sys.argv[1:]]
        done = subprocess.run(child, capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"variant {variant} failed:\n{done.stderr[-3000:]}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    full = next((r for r in results if r["variant"] == "full"), None)
    for result in results:
        if full:
            result["speedup_vs_full"] = round(full["seconds_per_step"] / result["seconds_per_step"], 2)
    print(
        json.dumps(
            {
                "benchmark": "train_cpu",
                "model": args.model_dir,
                "dataset": args.dataset_path,
                "max_length": args.max_length,
                "threads": args.threads,
                "bf16_autocast": args.bf16,
                "dtype": args.dtype,
                "peak_gflops": args.peak_gflops,
                "loadavg_before": load_before,
                "loadavg_after": os.getloadavg(),
                "variants": results,
                "median_seconds_per_step": statistics.median(r["seconds_per_step"] for r in results),
                "versions": package_versions(),
            }
        )
    )


if __name__ == "__main__":
    main()
