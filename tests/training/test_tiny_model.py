"""The tiny from-scratch model: real loading paths, stable token ids, a trainable chat template."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_round_trips_through_from_pretrained(tiny_model_dir):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from mirrorapi.training.tiny_model import default_corpus, train_tokenizer

    config = AutoConfig.from_pretrained(tiny_model_dir)
    assert config.model_type == "qwen2"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    params = sum(p.numel() for p in model.parameters())
    assert 500_000 <= params <= 1_000_000
    reloaded = AutoTokenizer.from_pretrained(tiny_model_dir)
    original = train_tokenizer(default_corpus())  # deterministic: same corpus, same merges
    text = '<|im_start|>user\n{"error": "", "response": "Café – 12,345 ünïcode ✓\\n\\t"}<|im_end|>\n'
    assert reloaded(text)["input_ids"] == original(text)["input_ids"]
    assert reloaded.decode(reloaded(text)["input_ids"]) == text
    assert reloaded.eos_token == "<|im_end|>"


def test_chat_template_marks_the_assistant_turn(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": '{"error":"","response":"ok"}'},
    ]
    encoded = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = encoded["input_ids"], encoded["assistant_masks"]
    assistant = tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
    assert assistant == '{"error":"","response":"ok"}<|im_end|>'
    prompt = tokenizer.apply_chat_template(messages[:2], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")


def test_script_builds_a_loadable_model(tmp_path):
    out = tmp_path / "tiny"
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts/make_tiny_model.py"), "--out", str(out), "--hidden-size", "64"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out).config.hidden_size == 64


def test_script_mistakes_are_one_line_not_a_traceback(tmp_path):
    """A missing --corpus file, or an --out that is a file, ended in a traceback (audit of 2026-12-01)."""
    a_file = tmp_path / "a-file"
    a_file.write_text("mine")
    for argv, says in (
        (["--corpus", str(tmp_path / "none.txt"), "--out", str(tmp_path / "m")], "tokenizer corpus: not a file"),
        (["--out", str(a_file)], "is a file, not a folder"),
    ):
        done = subprocess.run(
            [sys.executable, str(REPO / "scripts/make_tiny_model.py"), *argv], capture_output=True, text=True
        )
        assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert a_file.read_text() == "mine"
