"""`mirrorapi models get` of a shipped model: its LoRA adapter (package data) merged into its base model, as one
folder both CPU engines serve as it is. A tiny adapter trained here on the tiny model (the merge, the card, reuse,
a changed adapter, the errors), and the real path on SmolLM2-135M-Instruct (the GGUF llama.cpp serves).

The reference for what the folder must compute is PEFT's own forward pass of base + adapter, not our merge."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from mirrorapi.cli import main
from mirrorapi.few_shot import FEW_SHOT_CANDIDATES
from mirrorapi.models import shipped
from mirrorapi.models.catalogue import (
    ADAPTER_FILES,
    SHIPPED_CARD_FILE,
    TRAINING_FILE,
    ModelGetError,
    adapter_digest,
    base_gguf,
)
from mirrorapi.models.shipped import GGUF_FILE, get_shipped_model
from mirrorapi.models.to_gguf import gguf_for_serving, read_base_gguf

REPO = Path(__file__).resolve().parents[2]
SIMULATOR = "smollm2-135m-mirrorapi-simulator"
# What a shipped simulator's record says it must be served with (the demo reads these).
SERVER_SETTINGS = {
    "prompt_format": "mirrorapi-v2",
    "few_shot": 1,
    "few_shot_char_budget": 1024,
    "few_shot_response_chars": 600,
    "max_tokens": 512,
}
INPUT_IDS = torch.tensor([[5, 17, 99, 240, 3, 8]])


def as_shipped(trained: Path, folder: Path, **record) -> Path:
    """The four files a shipped adapter folder holds, taken from a training run's output (no tokenizer: a
    shipped adapter takes its base model's)."""
    folder.mkdir(parents=True)
    for name in ADAPTER_FILES:
        shutil.copyfile(trained / name, folder / name)
    info = json.loads((trained / TRAINING_FILE).read_text())
    (folder / TRAINING_FILE).write_text(json.dumps({**info, **record}))
    return folder


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=INPUT_IDS).logits


@pytest.fixture(scope="module")
def tiny_adapter(tiny_model_dir, simulator_sft_dir, tmp_path_factory, entry_script) -> Path:
    """A LoRA adapter trained for a few steps on the tiny model by the real recipe, as a shipped folder."""
    out = tmp_path_factory.mktemp("lora") / "trained"
    status = entry_script("training/sft.py").cli(
        [
            "--config",
            str(REPO / "training/configs/tiny_cpu.yaml"),
            "--model_name_or_path",
            str(tiny_model_dir),
            "--dataset_path",
            str(simulator_sft_dir),
            "--output_dir",
            str(out),
            "--use_peft",
            "true",
            "--lora_r",
            "4",
            "--lora_alpha",
            "8",
            "--lora_target_modules",
            "all-linear",
            "--learning_rate",
            "1e-2",
            "--max_steps",
            "4",
            "--max_train_samples",
            "8",
            "--max_length",
            "512",
            "--eval_strategy",
            "no",
            "--eval_on_start",
            "false",
            "--save_strategy",
            "no",
            "--disable_tqdm",
            "true",
        ]
    )
    assert status == 0
    return as_shipped(out, tmp_path_factory.mktemp("adapters") / SIMULATOR, server_settings=SERVER_SETTINGS)


@pytest.mark.slow
def test_the_folder_computes_what_base_and_adapter_compute(tiny_adapter, tiny_model_dir, tmp_path):
    said = []
    folder = get_shipped_model(
        SIMULATOR, tmp_path, adapter_dir=tiny_adapter, base_dir=tiny_model_dir, progress=said.append
    )
    assert folder == tmp_path / SIMULATOR and said[-1] == f"{SIMULATOR}: ready in {folder}"
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    base_logits = logits(base)
    expected = logits(PeftModel.from_pretrained(base, str(tiny_adapter)))
    assert not torch.allclose(expected, base_logits, atol=1e-4)  # the adapter changes what the model computes
    assert torch.allclose(logits(AutoModelForCausalLM.from_pretrained(folder)), expected, atol=1e-4)
    # A complete folder: the base's tokenizer and chat template, the card, the record with its serving settings.
    assert not (folder / "adapter_config.json").exists()  # merged: a plain model, for `transformers serve`
    template = AutoTokenizer.from_pretrained(tiny_model_dir).chat_template
    assert AutoTokenizer.from_pretrained(folder).chat_template == template
    # The adapter's card, read as the Hub reads a card: the merged folder is loaded by transformers, not PEFT.
    from huggingface_hub import ModelCard

    merged, shipped = (ModelCard.load(f / "README.md") for f in (folder, tiny_adapter))
    assert (shipped.data.library_name, merged.data.library_name) == ("peft", "transformers")
    assert merged.data.base_model == shipped.data.base_model and merged.text.endswith(shipped.text)
    record = json.loads((folder / TRAINING_FILE).read_text())
    assert record["adapter"] is False and record["server_settings"] == SERVER_SETTINGS
    card = json.loads((folder / SHIPPED_CARD_FILE).read_text())
    assert card["adapter"]["sha256"] == adapter_digest(tiny_adapter)
    assert card["weights"]["gguf_file"] is None  # the tiny base has no GGUF, so neither has its merge
    assert sorted(p.name for p in tmp_path.iterdir()) == [SIMULATOR]  # no partial folder left


@pytest.mark.slow
def test_a_second_call_reuses_the_folder_and_a_new_adapter_remakes_it(tiny_adapter, tiny_model_dir, tmp_path):
    folder = get_shipped_model(
        SIMULATOR, tmp_path, adapter_dir=tiny_adapter, base_dir=tiny_model_dir, progress=lambda line: None
    )
    made = (folder / "model.safetensors").stat().st_mtime_ns
    said = []
    assert (
        get_shipped_model(SIMULATOR, tmp_path, adapter_dir=tiny_adapter, base_dir=tiny_model_dir, progress=said.append)
        == folder
    )
    assert said == [f"{SIMULATOR}: reusing {folder}"] and (folder / "model.safetensors").stat().st_mtime_ns == made
    # --force makes it again even where the folder looks complete (the way to repair a damaged one); a build folder
    # an interrupted run left hours ago is removed, a recent one (another process's build under way) is not.
    weights = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(b"damaged")
    old, recent = tmp_path / f".{SIMULATOR}.partial-killed", tmp_path / f".{SIMULATOR}.partial-running"
    old.mkdir(), recent.mkdir()
    os.utime(old, (0, 0))
    get_shipped_model(
        SIMULATOR, tmp_path, adapter_dir=tiny_adapter, base_dir=tiny_model_dir, force=True, progress=lambda line: None
    )
    assert (folder / "model.safetensors").read_bytes() == weights
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [recent.name]
    # A new release of the package ships other adapter files: the folder is made again from them.
    newer = shutil.copytree(tiny_adapter, tmp_path / "newer" / SIMULATOR)
    (newer / "README.md").write_text("# a newer card\n")
    said.clear()
    get_shipped_model(SIMULATOR, tmp_path, adapter_dir=newer, base_dir=tiny_model_dir, progress=said.append)
    assert said[0] != f"{SIMULATOR}: reusing {folder}"
    assert (folder / "README.md").read_text() == "# a newer card\n"


@pytest.mark.slow
def test_an_adapter_of_the_other_kind_is_refused(tiny_adapter, tiny_model_dir, tmp_path):
    judge = as_shipped(tiny_adapter, tmp_path / "judge", kind="judge")
    with pytest.raises(ModelGetError, match=f"a judge adapter, where {SIMULATOR} is a simulator"):
        get_shipped_model(SIMULATOR, tmp_path / "models", adapter_dir=judge, base_dir=tiny_model_dir)
    assert not (tmp_path / "models").exists()
    # An adapter of another base (SmolLM2's, on the tiny model): one line, where it printed 28 size mismatches.
    shipped = REPO / "mirrorapi" / "models" / "adapters" / SIMULATOR
    with pytest.raises(ModelGetError, match="the adapter's weights do not fit it") as refused:
        get_shipped_model(SIMULATOR, tmp_path / "models", adapter_dir=shipped, base_dir=tiny_model_dir)
    assert "\n" not in str(refused.value)
    assert [p.name for p in (tmp_path / "models").iterdir()] == []  # no partial folder left


def test_an_adapter_not_shipped_yet_is_one_line_and_nothing_is_made(tmp_path, monkeypatch, capsys):
    # The package's folder as it is before the adapter ships: its README only.
    adapters = tmp_path / "adapters"
    (adapters / SIMULATOR).mkdir(parents=True)
    (adapters / SIMULATOR / "README.md").write_text("# not shipped yet\n")
    monkeypatch.setattr(shipped, "ADAPTERS_DIR", adapters)
    status = main(["models", "get", SIMULATOR, "--models-dir", str(tmp_path / "models")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and len(err) == 1
    assert err[0] == (
        f"mirrorapi models get: error: {SIMULATOR}: the adapter is not shipped yet (mirrorapi/models/"
        f"adapters/{SIMULATOR}/ lacks adapter_config.json, adapter_model.safetensors, "
        "mirrorapi_training.json; its README.md says what will be there); pass --adapter DIR to use an "
        "adapter folder of your own"
    )
    # An adapter folder given by hand that lacks files; --adapter for a base model.
    assert (
        main(
            [
                "models",
                "get",
                SIMULATOR,
                "--adapter",
                str(adapters / SIMULATOR),
                "--models-dir",
                str(tmp_path / "models"),
            ]
        )
        == 1
    )
    assert capsys.readouterr().err.strip() == (
        f"mirrorapi models get: error: {adapters / SIMULATOR} is not an adapter folder to ship: it lacks "
        "adapter_config.json, adapter_model.safetensors, mirrorapi_training.json"
    )
    assert main(["models", "get", "smollm2-135m-instruct", "--adapter", str(adapters / SIMULATOR)]) == 1
    assert "--adapter is for the shipped models" in capsys.readouterr().err
    assert not (tmp_path / "models").exists()


def test_models_list_names_the_shipped_models_and_their_state(tmp_path, monkeypatch, capsys):
    adapters = tmp_path / "adapters"
    (adapters / SIMULATOR).mkdir(parents=True)
    monkeypatch.setattr("mirrorapi.models.catalogue.ADAPTERS_DIR", adapters)
    assert main(["models", "list", "--models-dir", str(tmp_path / "models")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert (
        f"{SIMULATOR}  simulator, a LoRA adapter on smollm2-135m-instruct shipped in this package  not shipped "
        "yet" in lines
    )
    assert any(line.startswith("smollm2-135m-mirrorapi-judge  judge, ") for line in lines)


# ------------------------------------------------------------------------------------ slow: real weights
@pytest.fixture(scope="module")
def smollm2_adapter(smollm2_dir, tmp_path_factory) -> Path:
    """A stand-in for the shipped simulator's adapter (the merge must not depend on how the adapter was trained):
    PEFT's LoRA on every linear layer of SmolLM2, its B matrices (zero when PEFT makes them) moved by seeded
    noise, saved as PEFT saves it, with a card and a record."""
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(smollm2_dir),
        LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)
    folder = tmp_path_factory.mktemp("adapters") / SIMULATOR
    model.save_pretrained(folder)
    (folder / "README.md").write_text(
        "---\nlicense: apache-2.0\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct\n"
        "library_name: peft\n---\n# a stand-in\n"
    )
    (folder / TRAINING_FILE).write_text(
        json.dumps(
            {"kind": "simulator", "prompt_format": "mirrorapi-v2", "adapter": True, "server_settings": SERVER_SETTINGS}
        )
    )
    return folder


@pytest.mark.slow
def test_the_real_path_gives_a_folder_llama_cpp_serves_as_it_is(smollm2_dir, smollm2_adapter, capsys):
    import gguf
    from safetensors import safe_open

    assert (
        main(["models", "get", SIMULATOR, "--models-dir", str(smollm2_dir.parent), "--adapter", str(smollm2_adapter)])
        == 0
    )
    folder = Path(capsys.readouterr().out.strip())
    assert folder == smollm2_dir.parent / SIMULATOR
    base = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    expected = logits(PeftModel.from_pretrained(base, str(smollm2_adapter)))
    assert torch.allclose(logits(AutoModelForCausalLM.from_pretrained(folder)), expected, atol=1e-3)
    assert "Apache License" in (folder / "LICENSE").read_text()  # the base model's licence
    assert (folder / "chat_template.jinja").read_text() == (smollm2_dir / "chat_template.jinja").read_text()

    # The GGUF llama.cpp serves is the folder's own (scripts/serve_engine_cpu.sh asks `models gguf`), exported
    # once: its tokenizer is the base GGUF's and its matrices are the merged ones (v: no rotary permutation).
    exported = folder / GGUF_FILE
    written = exported.stat().st_mtime_ns
    assert gguf_for_serving(folder) == exported and exported.stat().st_mtime_ns == written
    assert main(["models", "gguf", str(folder)]) == 0 and capsys.readouterr().out.strip() == str(exported)
    # The base as the export read it (parsed once per process: `read_base_gguf`), the export as written.
    reader, base_reader = gguf.GGUFReader(exported), read_base_gguf(base_gguf(smollm2_dir))
    assert reader.fields["tokenizer.ggml.tokens"].contents() == base_reader.fields["tokenizer.ggml.tokens"].contents()
    served = next(t for t in reader.tensors if t.name == "blk.0.attn_v.weight")
    with safe_open(folder / "model.safetensors", framework="pt") as handle:
        merged = handle.get_tensor("model.layers.0.self_attn.v_proj.weight")
    assert served.tensor_type.name == "F16"
    assert torch.allclose(torch.from_numpy(served.data.copy()).float(), merged.half().float())
    assert not torch.equal(merged, base.model.layers[0].self_attn.v_proj.weight)  # merged, not the base's
    shutil.rmtree(folder)  # 775 MB no other test reads (kept when an assertion above fails, to be looked at)


def test_the_settings_a_record_says_a_model_must_be_served_with():
    from mirrorapi.models.catalogue import serving_settings

    # Named in the record: as they are.
    assert serving_settings({"kind": "judge", "server_settings": {"max_tokens": 16}}) == {"max_tokens": 16}
    # Else a simulator is shown what its data showed it; a judge's record says nothing of a server.
    assert serving_settings({"kind": "judge", "dataset_stats": {"options": {"test_fraction": 0.1}}}) == {}
    stats = {"options": {"prompt_format": "mirrorapi-v2", "few_shot": 0, "history": 8, "history_char_budget": 4096}}
    assert serving_settings(
        {"kind": "simulator", "prompt_format": "mirrorapi-session-v2", "dataset_stats": stats}
    ) == {"prompt_format": "mirrorapi-v2", "few_shot": 0, "session_history": 8, "session_char_budget": 4096}
    # Trained on calls alone (`history: 0`, the data builder's default): served so, though the server's default
    # shows 8 earlier calls of a session, in a prompt format the model never saw.
    alone = {"options": {"prompt_format": "mirrorapi-v2", "few_shot": 1, "history": 0}}
    assert serving_settings({"kind": "simulator", "dataset_stats": alone})["session_history"] == 0
    # The examples' tie rule its data was built with (a record written before the rule existed names none: the
    # server's default, the shortest, is the rule it was built with).
    stats["options"] |= {"few_shot": 1, "few_shot_ties": "median"}
    assert serving_settings({"kind": "simulator", "dataset_stats": stats})["few_shot_ties"] == "median"


def test_the_shipped_simulator_is_served_with_the_tie_rule_its_record_names(samples):
    """The shipped adapter's data were built before the tie rule was a setting, with ties to the shortest example;
    served with the median-size one it scored higher on the held-out calls (docs/training.md), so its record's
    server settings name `median`, and a server started with them must choose that way, not by its default."""
    from mirrorapi.models.catalogue import serving_settings
    from mirrorapi.serving.config import load_settings

    record = json.loads((shipped.ADAPTERS_DIR / "smollm2-135m-mirrorapi-simulator" / TRAINING_FILE).read_text())
    assert "few_shot_ties" not in record["dataset_stats"]["options"] and record["server_settings"]["few_shot"] == 1
    settings = {**serving_settings(record), "tools_folder": [str(samples / "tools")]}
    without_rule = {key: value for key, value in settings.items() if key != "few_shot_ties"}
    assert load_settings(overrides=without_rule, environ={}).few_shot_ties == "shortest"  # the default, not taken
    assert load_settings(overrides=settings, environ={}).few_shot_ties == "median"


@pytest.mark.shared
def test_the_shipped_simulator_is_shown_a_real_reservation_whole(shared_data, tmp_path):
    """The shipped simulator trained on examples shrunk to 600 characters; shown them whole (up to 2,000) it wrote
    tau-bench's reservations, 525-1,042 characters, at their length and scored above the nearest example
    (docs/training.md), so its record's server settings show them whole. A server started with those settings
    shows a real recorded reservation's every value; with the sizes it trained on, some are cut."""
    from mirrorapi.models.catalogue import serving_settings
    from mirrorapi.records import read_pairs_jsonl
    from mirrorapi.serving.cache import ResponseCache, import_pairs
    from mirrorapi.serving.config import load_settings
    from mirrorapi.serving.simulator import Simulator
    from mirrorapi.tools import ToolRegistry

    def leaves(value) -> list[str]:
        if isinstance(value, dict):
            return [leaf for v in value.values() for leaf in leaves(v)]
        if isinstance(value, list):
            return [leaf for v in value for leaf in leaves(v)]
        return [json.dumps(value)]

    reservations = [
        p
        for p in read_pairs_jsonl(shared_data / "pairs" / "tau-bench.jsonl")
        if p["api_name"] == "get_reservation_details"
    ]
    example = max(reservations, key=lambda p: len(p["response"]["response"]))  # a round trip with connections
    assert 1000 < len(example["response"]["response"]) < 2000
    pairs_file = tmp_path / "pairs.jsonl"
    pairs_file.write_text(json.dumps(example) + "\n")
    tools = shared_data / "toolenv" / "realtools"
    registry = ToolRegistry.load([tools])
    cache = ResponseCache(tmp_path / "cache.sqlite")
    import_pairs(cache, pairs_file, registry)
    doc = registry.get(example["category"], example["tool_name"], example["api_name"])

    record = json.loads((shipped.ADAPTERS_DIR / SIMULATOR / TRAINING_FILE).read_text())
    served = {**serving_settings(record), "tools_folder": [str(tools)]}
    trained_on = record["dataset_stats"]["options"]
    as_trained = {key: trained_on[key] for key in ("few_shot_char_budget", "few_shot_response_chars")}
    values = leaves(json.loads(example["response"]["response"]))
    shown = {}
    for name, overrides in (("served", served), ("as trained", {**served, **as_trained})):
        simulator = Simulator(engine=None, settings=load_settings(overrides=overrides, environ={}))
        candidates = cache.examples(doc.category, doc.tool, doc.api, FEW_SHOT_CANDIDATES)  # what the server reads
        prompt = simulator.messages(doc, {"reservation_id": "ZZZ999"}, candidates=candidates)[1]["content"]
        shown[name] = sum(value in prompt for value in values)
    cache.close()
    assert shown["served"] == len(values) > shown["as trained"]


@pytest.mark.slow
def test_the_shipped_simulator_answers_as_its_record_says(smollm2_dir, tmp_path):
    """The adapter this package ships, merged into SmolLM2 as `models get` does, answers a real tau-bench call with
    one strict `{"error", "response"}` object (greedy, its record's prompt format and max_tokens, one real example
    of the same API shown, as the server shows it)."""
    from mirrorapi.prompts.simulator_formats import simulator_messages
    from mirrorapi.prompts.simulator_output import is_strict_observation
    from mirrorapi.records import read_pairs_jsonl
    from mirrorapi.tools import ToolRegistry

    def greedy(folder: Path, messages: list[dict], max_new_tokens: int) -> str:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder)
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
        return tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)

    simulator = get_shipped_model(SIMULATOR, tmp_path, progress=lambda line: None, base_dir=smollm2_dir)
    record = json.loads((simulator / TRAINING_FILE).read_text())
    samples = REPO / "data" / "samples"
    pairs = [p for p in read_pairs_jsonl(samples / "pairs.jsonl") if p["api_name"] == "calculate"]
    example, call = pairs[0], pairs[1]
    doc = ToolRegistry.load([samples / "tools"]).get(call["category"], call["tool_name"], call["api_name"])
    messages = simulator_messages(
        doc,
        call["tool_input"],
        [(example["tool_input"], example["response"])],
        fmt=record["server_settings"]["prompt_format"],
    )
    answer = greedy(simulator, messages, record["server_settings"]["max_tokens"])
    assert is_strict_observation(answer), answer
