"""End to end as a user runs it: the builder CLI on a slice of real pairs, `accelerate launch` of the
tiny recipe, eval and checkpoints, `--resume`, and `transformers serve` answering from the result."""

import json
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from datasets import load_from_disk

from harness.processes import transformers_serve

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "data" / "samples"
SHARED_DATA = REPO.parent / "shared" / "data"
STEPS = 40


@pytest.fixture(scope="module")
def pair_slice(tmp_path_factory):
    """The first 600 pairs of the shared API-Bank generated set (data/samples without ../shared)."""
    shared = SHARED_DATA / "pairs" / "api-bank-generated.jsonl"
    if not shared.is_file():
        return SAMPLES / "pairs.jsonl", SAMPLES / "tools"
    path = tmp_path_factory.mktemp("slice") / "api-bank-generated-600.jsonl"
    with open(shared, encoding="utf-8") as fh:
        path.write_text("".join(next(fh) for _ in range(600)), encoding="utf-8")
    return path, SHARED_DATA / "toolenv" / "realtools"


@pytest.fixture(scope="module")
def launched(pair_slice, tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("accelerate")
    pairs, tools = pair_slice
    build = subprocess.run(
        [
            sys.executable,
            str(REPO / "data/build_simulator_sft.py"),
            "--pairs",
            str(pairs),
            "--tools",
            str(tools),
            "--out",
            str(root / "data"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    command = [
        str(Path(sys.executable).parent / "accelerate"),
        "launch",
        "--config_file",
        str(REPO / "training/accelerate/cpu.yaml"),
        str(REPO / "training/sft.py"),
        "--config",
        str(REPO / "training/configs/tiny_cpu.yaml"),
        "--model_name_or_path",
        str(tiny_model_dir),
        "--dataset_path",
        str(root / "data"),
        "--output_dir",
        str(root / "out"),
        "--max_steps",
        str(STEPS),
        "--logging_steps",
        "5",
        "--eval_steps",
        str(STEPS // 2),
        "--save_steps",
        str(STEPS // 2),
        "--max_eval_samples",
        "8",
        "--disable_tqdm",
        "true",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    return root, result


def history(out):
    return json.loads((out / "mirrorapi_training.json").read_text())["log_history"]


@pytest.mark.slow
def test_loss_and_eval_loss_fall(launched):
    root, result = launched
    logs = history(root / "out")
    losses = [e["loss"] for e in logs if "loss" in e]
    assert len(losses) == STEPS // 5 and losses[-1] < losses[0] * 0.7
    for split in ("test_id", "test_ood"):
        evals = [e[f"eval_{split}_loss"] for e in logs if f"eval_{split}_loss" in e]
        assert len(evals) == 3 and evals[-1] < evals[0]  # on start, half way, at the end
    trained = [e for e in logs if "loss" in e]
    assert all(e["tokens_per_second"] > 0 and e["learning_rate"] > 0 for e in trained[1:])
    assert "tokens_per_second" in result.stdout  # logged as it trains, not only in the file (in any format)
    assert {p.name for p in (root / "out").glob("checkpoint-*")} == {f"checkpoint-{STEPS // 2}", f"checkpoint-{STEPS}"}
    stats = json.loads((root / "data/stats.json").read_text())
    assert stats["kept"]["error"] > 0 and stats["splits"]["test_ood"]["apis"] > 0


@pytest.mark.slow
def test_resume_continues_from_the_last_checkpoint(launched, tiny_model_dir, entry_script):
    root, _ = launched
    first_loss = next(e["loss"] for e in history(root / "out") if "loss" in e)
    assert (
        entry_script("training/sft.py").cli(
            [
                "--config",
                str(REPO / "training/configs/tiny_cpu.yaml"),
                "--model_name_or_path",
                str(tiny_model_dir),
                "--dataset_path",
                str(root / "data"),
                "--output_dir",
                str(root / "out"),
                "--max_steps",
                str(STEPS + 10),
                "--logging_steps",
                "5",
                "--eval_strategy",
                "no",
                "--eval_on_start",
                "false",
                "--save_strategy",
                "no",
                "--resume",
                "true",
                "--disable_tqdm",
                "true",
            ]
        )
        == 0
    )
    logs = history(root / "out")
    resumed = [e for e in logs if "loss" in e and e["step"] > STEPS]
    assert [e["step"] for e in resumed] == [STEPS + 5, STEPS + 10]
    assert resumed[0]["loss"] < first_loss * 0.7  # the weights came back, not a fresh start
    assert json.loads((root / "out/mirrorapi_training.json").read_text())["metrics"]["steps"] == STEPS + 10


@pytest.mark.slow
def test_checkpoint_is_served_by_transformers_serve(launched, tmp_path):
    root, _ = launched
    record = load_from_disk(str(root / "data"))["train"][0]
    with transformers_serve(root / "out", log_path=tmp_path / "serve.log", timeout=180) as engine:
        client = openai.OpenAI(base_url=engine.base_url, api_key="EMPTY")
        completion = client.chat.completions.create(
            model=engine.model, messages=record["prompt"], temperature=0, max_tokens=32
        )
    assert completion.choices[0].message.content.startswith('{"')  # trained 40 steps: the format begins
