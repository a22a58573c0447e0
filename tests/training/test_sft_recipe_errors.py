"""A mistake in a recipe ends in one clear `error:` line and status 2, before any model is loaded."""

import http.server
import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY_RECIPE = str(REPO / "training/configs/tiny_cpu.yaml")


@pytest.fixture(scope="module")
def cli(entry_script):
    return entry_script("training/sft.py").cli


@pytest.fixture(scope="module")
def no_template_model(tiny_model_dir, tmp_path_factory):
    """The tiny model with its chat template removed (a base model's tokenizer)."""
    out = tmp_path_factory.mktemp("no-template") / "model"
    shutil.copytree(tiny_model_dir, out)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((out / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


@pytest.fixture(scope="module")
def text_only_dataset(tmp_path_factory):
    from datasets import Dataset, DatasetDict

    out = tmp_path_factory.mktemp("bad-data") / "text"
    rows = Dataset.from_dict({"text": ["hello"], "answer": ["x"]})
    DatasetDict({"train": rows, "test_id": rows, "test_ood": rows}).save_to_disk(str(out))
    return out


def run(cli, capsys, *argv):
    status = cli(["--config", TINY_RECIPE, *map(str, argv)])
    err = capsys.readouterr().err.strip().splitlines()
    return status, err[-1] if err else ""


def test_unknown_recipe_key(cli, capsys, tmp_path, tiny_model_dir, simulator_sft_dir):
    recipe = tmp_path / "typo.yaml"
    recipe.write_text(open(TINY_RECIPE).read() + "learning_rat: 0.1\nlora_rnk: 4\n")
    status = cli(["--config", str(recipe), "--model_name_or_path", str(tiny_model_dir)])
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert (
        err == f"sft.py: error: unknown key(s) in {recipe}: learning_rat, lora_rnk (`training/sft.py --help` "
        "lists the keys)"
    )


@pytest.mark.parametrize(
    "line, message",
    [
        ("max_steps: 1.5", "max_steps: 1.5 is not a valid value"),
        ("train_top_layers: true", "train_top_layers: True is not a valid value"),
        ("learning_rate: [1, 2]", "learning_rate: expected one value, got the list [1, 2]"),
        ("eval_splits: 5", "eval_splits: expected a list, got 5"),
        ("use_peft: 2", "use_peft: 2 is not a valid value"),  # TRL's bool parser raised ArgumentTypeError
    ],
)
def test_a_value_of_the_wrong_type_in_a_recipe_file(cli, capsys, tmp_path, tiny_model_dir, line, message):
    """TRL hands a recipe file's values to argparse as defaults, which it converts only when they are strings: a
    YAML number or list of the wrong kind used to fail in transformers' trainer or torch's optimizer, after the
    model was loaded, with a traceback (or, `true` for a count, be taken as 1)."""
    recipe = tmp_path / "wrong.yaml"
    key = line.split(":")[0]
    kept = [row for row in open(TINY_RECIPE).read().splitlines() if not row.startswith(f"{key}:")]
    recipe.write_text("\n".join([*kept, line]) + "\n")
    status = cli(["--config", str(recipe), "--model_name_or_path", str(tiny_model_dir)])
    err = capsys.readouterr().err.strip()
    assert status == 2 and err.startswith(f"sft.py: error: {recipe}: {message}") and len(err.splitlines()) == 1


def test_dataset_without_the_expected_columns(cli, capsys, tiny_model_dir, text_only_dataset, tmp_path):
    status, err = run(
        cli,
        capsys,
        "--model_name_or_path",
        tiny_model_dir,
        "--dataset_path",
        text_only_dataset,
        "--output_dir",
        tmp_path / "out",
    )
    assert status == 2
    assert err.startswith("sft.py: error: split 'train' of") and "lacks the column(s) prompt, completion" in err
    assert "it has: text, answer" in err
    assert not (tmp_path / "out").exists()


def test_base_model_that_does_not_exist(cli, capsys, simulator_sft_dir, tmp_path):
    status, err = run(
        cli,
        capsys,
        "--model_name_or_path",
        tmp_path / "no-model",
        "--dataset_path",
        simulator_sft_dir,
        "--output_dir",
        tmp_path / "out",
    )
    assert (status, err) == (2, f"sft.py: error: base model folder not found: {tmp_path / 'no-model'}")


def test_tokenizer_without_a_chat_template(cli, capsys, no_template_model, simulator_sft_dir, tmp_path):
    status, err = run(
        cli,
        capsys,
        "--model_name_or_path",
        no_template_model,
        "--dataset_path",
        simulator_sft_dir,
        "--output_dir",
        tmp_path / "out",
    )
    assert status == 2
    assert err.startswith(f"sft.py: error: the tokenizer of {no_template_model} has no chat template")
    assert "--chat_template_path" in err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--dataset_path", "nowhere/data"], "dataset folder not found: nowhere/data"),
        (["--eval_splits", "test"], "is a simulator dataset (its splits: train, test_id, test_ood), and this recipe"),
        (["--resume", "true"], "--resume: no checkpoint in"),
        (["--merge", "true"], "--merge applies to LoRA training only"),
        (["--train_top_layers", "1", "--gradient_checkpointing", "true"], "gradient_checkpointing would run it"),
        (["--init_adapter", "runs"], "init_adapter continues a LoRA adapter: it needs use_peft true"),
        (["--use_peft", "true", "--init_adapter", "tests"], "init_adapter: tests is not a LoRA adapter folder"),
        # TRL would take this file for a tokenizer's folder, and fail after loading the model.
        (["--chat_template_path", "README.md"], "--chat_template_path README.md: a template file named *.jinja"),
        # Numbers out of range: transformers, torch and PEFT refused them inside trainer.train(), after the model
        # loaded, with a traceback; max_steps 0 trained one step and saved the model, a negative one trained epochs.
        (["--max_steps", "0"], "max_steps must be positive, or -1 for num_train_epochs (got 0)"),
        (["--max_steps", "-3"], "max_steps must be positive, or -1 for num_train_epochs (got -3)"),
        (["--learning_rate", "-1"], "learning_rate must not be negative (got -1.0)"),
        (["--per_device_train_batch_size", "0"], "per_device_train_batch_size must be at least 1 (got 0)"),
        (["--max_length", "0"], "max_length must be at least 1 (got 0)"),
        (["--use_peft", "true", "--lora_r", "0"], "lora_r must be at least 1 (got 0)"),
        (["--use_peft", "true", "--lora_dropout", "2"], "lora_dropout is a probability below 1 (got 2.0)"),
        (["--resume_from_checkpoint", "nowhere/checkpoint-3"], "no checkpoint folder at nowhere/checkpoint-3"),
    ],
)
def test_other_mistakes(cli, capsys, tiny_model_dir, simulator_sft_dir, tmp_path, extra, message):
    argv = [
        "--model_name_or_path",
        tiny_model_dir,
        "--dataset_path",
        simulator_sft_dir,
        "--output_dir",
        tmp_path / "out",
        *extra,
    ]
    status, err = run(cli, capsys, *argv)
    assert status == 2 and message in err and err.startswith("sft.py: error: ")


def test_bfloat16_on_a_cpu_without_it_ends_before_the_model_loads(
    cli, capsys, monkeypatch, tiny_model_dir, simulator_sft_dir, tmp_path
):
    """The GPU recipes' precision run with --use_cpu on a CPU that would emulate bfloat16 (10-30x slower than float32):
    status 2 and one line naming the keys that train in float32, nothing written."""
    from mirrorapi.training import recipe

    # A stand-in for the hardware (named as such): a CPU without oneDNN's bfloat16 cannot be had on one with it.
    monkeypatch.setattr(recipe, "cpu_has_bfloat16", lambda: False)
    out = tmp_path / "out"
    status, err = run(
        cli,
        capsys,
        "--model_name_or_path",
        tiny_model_dir,
        "--dataset_path",
        simulator_sft_dir,
        "--output_dir",
        out,
        "--use_cpu",
        "true",
        "--bf16",
        "true",
        "--dtype",
        "bfloat16",
    )
    assert status == 2
    assert err.startswith("sft.py: error: bf16 and dtype bfloat16 on a CPU without oneDNN's bfloat16")
    assert err.endswith("pass --bf16 false --dtype float32")
    assert not out.exists()


class _RecordingHub(http.server.BaseHTTPRequestHandler):
    """A model hub that has nothing: every request is recorded (`server.requests`) and answered 404."""

    def _record(self):
        self.server.requests.append(f"{self.command} {self.path}")
        self.send_response(404)
        self.send_header("content-length", "0")
        self.end_headers()

    do_GET = do_HEAD = do_POST = _record

    def log_message(self, *args):
        pass


def test_typo_in_a_relative_local_path_one_line_under_accelerate(tmp_path, monkeypatch, simulator_sft_dir):
    """As a command under `accelerate launch -q`: `runs/tiny-bse` while `runs/` exists is a local path, so one
    line and no model-hub request (HF_HUB_OFFLINE unset; the hub's retries took 58 s and 40 lines). The hub is a
    local server that records what it is asked (HF_ENDPOINT): nothing."""
    (tmp_path / "runs/tiny-base").mkdir(parents=True)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RecordingHub)
    hub.requests = []
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{hub.server_port}")
    accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent))
    try:
        result = subprocess.run(
            [
                accelerate,
                "launch",
                "-q",
                "--num_cpu_threads_per_process",
                "1",
                "--config_file",
                str(REPO / "training/accelerate/cpu.yaml"),
                str(REPO / "training/sft.py"),
                "--config",
                TINY_RECIPE,
                "--model_name_or_path",
                "runs/tiny-bse",
                "--dataset_path",
                str(simulator_sft_dir),
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        hub.shutdown()
        hub.server_close()
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == ["sft.py: error: base model folder not found: runs/tiny-bse"]
    assert hub.requests == []


@pytest.mark.parametrize(
    "script, function, flag",
    [
        ("training/sft.py", "cli", "--dataset_path"),
        ("training/merge_lora.py", "main", "--adapter"),
        ("data/build_simulator_sft.py", "main", "--stabletoolbench-cache"),
        ("data/build_judge_sft.py", "main", "--labelled"),
    ],
)
def test_help_exits_0(entry_script, capsys, script, function, flag):
    with pytest.raises(SystemExit) as exit_:
        getattr(entry_script(script), function)(["--help"])
    assert exit_.value.code == 0 and flag in capsys.readouterr().out


def test_a_dataset_of_a_train_split_alone_trains_from_the_command_line(
    cli, capsys, tiny_model_dir, simulator_sft_dir, tmp_path
):
    from datasets import DatasetDict, load_from_disk

    train_only = tmp_path / "train-only"
    DatasetDict({"train": load_from_disk(str(simulator_sft_dir))["train"].select(range(4))}).save_to_disk(train_only)
    argv = ["--model_name_or_path", tiny_model_dir, "--dataset_path", train_only, "--output_dir", tmp_path / "out"]
    status, err = run(cli, capsys, *argv)
    assert status == 2 and "has no split 'test_id'" in err and "--eval_splits" in err
    argv += ["--eval_splits", "none", "--eval_strategy", "no", "--eval_on_start", "false", "--max_steps", "1"]
    status, err = run(cli, capsys, *argv)
    assert status == 0, err
    assert (tmp_path / "out" / "mirrorapi_training.json").is_file()


def test_an_output_dir_holding_an_earlier_run_is_refused_not_written_over(
    cli, capsys, tiny_model_dir, simulator_sft_dir, tmp_path
):
    """Training into a folder that held a trained model replaced it without a word, transformers' checkpoint rotation
    deleting the earlier run's checkpoints (and into the base model's own folder, the base). Refused before any model
    is loaded, the folder untouched; `--resume true` goes on with that run, `--overwrite_output_dir true` replaces
    it."""
    from types import SimpleNamespace

    from mirrorapi.training.recipe import RecipeArguments, check_output_dir

    earlier = tmp_path / "earlier"
    shutil.copytree(tiny_model_dir, earlier)
    (earlier / "checkpoint-10").mkdir()
    before = {p.name: p.stat().st_mtime_ns for p in earlier.iterdir()}
    common = ["--model_name_or_path", tiny_model_dir, "--dataset_path", simulator_sft_dir]
    status, err = run(cli, capsys, *common, "--output_dir", earlier)
    assert status == 2 and err.startswith(f"sft.py: error: output_dir {earlier} holds an earlier run's model")
    assert "(config.json, checkpoint-10)" in err and "--overwrite_output_dir true" in err
    assert {p.name: p.stat().st_mtime_ns for p in earlier.iterdir()} == before
    status, err = run(cli, capsys, *common, "--output_dir", tiny_model_dir, "--overwrite_output_dir", "true")
    assert status == 2 and err == (
        f"sft.py: error: output_dir {tiny_model_dir} is the base model's folder: training would write over the model "
        "it starts from; give another folder"
    )

    def check(**recipe) -> None:
        training = SimpleNamespace(output_dir=str(earlier), resume_from_checkpoint=None)
        check_output_dir(RecipeArguments(**recipe), training, SimpleNamespace(model_name_or_path=str(tiny_model_dir)))

    check(overwrite_output_dir=True)  # said so: replaced
    check(resume=True)  # that run goes on
    check_output_dir(
        RecipeArguments(),
        SimpleNamespace(output_dir=str(tmp_path / "new"), resume_from_checkpoint=None),
        SimpleNamespace(model_name_or_path=str(tiny_model_dir)),
    )


def test_a_judge_set_given_to_the_simulator_recipe_names_the_judge_recipe(
    cli, capsys, tiny_model_dir, judge_sft_dir, tmp_path
):
    """The judge set given to tiny_cpu.yaml said "has no split 'test_id' ... set --train_split / --eval_splits", and
    following that hint trained the simulator recipe on judge data, its card naming a judge in a simulator folder."""
    argv = ["--model_name_or_path", tiny_model_dir, "--dataset_path", judge_sft_dir, "--output_dir", tmp_path / "out"]
    status, err = run(cli, capsys, *argv)
    assert status == 2 and err == (
        f"sft.py: error: {judge_sft_dir} is a judge dataset (its splits: train, test), and this recipe asks for the "
        "split 'test_id' of the other kind's: use a judge recipe (training/configs/tiny_judge_cpu.yaml or "
        "judge_*.yaml, whose eval_splits are test)"
    )
