"""A fine-tuned SmolLM2 folder exported back to GGUF (mirrorapi.models.to_gguf) and served by llama.cpp's server
(mirrorapi.llama_cpp_engine): the engine must answer what transformers answers, through the OpenAI API our
clients use. The llama.cpp tests need `llama-cpp-python[server]` (the `cpu-engine` extra, `make engine`) and
skip with that reason without it.

References from outside the code under test: transformers' own GGUF loader (its llama tensor processor
undoes llama.cpp's q/k permutation: ours must be its inverse) and transformers' `generate` (greedy tokens).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

from harness.processes import (
    RunningEngine,
    cpu_engine_serve,
    free_port,
    llama_cpp_available,
    stop,
    wait_until_engine_answers,
)
from mirrorapi.cli import main
from mirrorapi.engine_client import EngineClient
from mirrorapi.llama_cpp_engine import GrammarCheckedGreedy, check_grammar_first, explicit_any, openai_request
from mirrorapi.models.catalogue import base_gguf
from mirrorapi.models.to_gguf import GGUFExportError, export_gguf, gguf_for_serving, permute_for_gguf, read_base_gguf
from mirrorapi.prompts.simulator_formats import OBSERVATION_SCHEMA, simulator_messages
from mirrorapi.prompts.simulator_output import is_strict_observation
from mirrorapi.records import read_pairs_jsonl
from mirrorapi.tools import ToolRegistry

REPO = Path(__file__).resolve().parents[2]
needs_llama_cpp = pytest.mark.skipif(
    not llama_cpp_available(),
    reason=("llama-cpp-python[server] is not installed (the cpu-engine extra: `make engine`, a 3-9 min build)"),
)


@pytest.mark.parametrize(("n_head", "n_kv"), [(9, 3), (4, 4)])
def test_the_permutation_is_the_inverse_of_transformers_gguf_loader(n_head, n_kv):
    processor = LlamaTensorProcessor(config={"num_attention_heads": n_head, "num_key_value_heads": n_kv})
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((n_head * 64, 576)), rng.standard_normal((n_kv * 64, 576))
    assert np.array_equal(processor.process(permute_for_gguf(q, n_head), "blk.0.attn_q.weight").weights, q)
    assert np.array_equal(processor.process(permute_for_gguf(k, n_kv), "blk.0.attn_k.weight").weights, k)
    assert not np.array_equal(permute_for_gguf(q, n_head), q)


def test_the_openai_request_is_put_in_llama_cpp_python_s_dialect():
    body = {
        "model": "m",
        "messages": [],
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "observation", "schema": OBSERVATION_SCHEMA},
        },
    }
    rewritten = json.loads(openai_request(json.dumps(body).encode()))
    schema = rewritten["response_format"].pop("schema")
    assert rewritten["response_format"] == {"type": "json_object"}
    # llama.cpp's grammar compiler reads an empty schema as "an object": `response` must stay any JSON value.
    assert schema == {
        **OBSERVATION_SCHEMA,
        "properties": {
            "error": {"type": "string"},
            "response": {"type": ["string", "number", "boolean", "object", "array", "null"]},
        },
    }
    assert rewritten["repeat_penalty"] == 1.0
    assert json.loads(openai_request(json.dumps({"repeat_penalty": 1.3}).encode()))["repeat_penalty"] == 1.3
    # Not OpenAI's shape: passed on as sent, for the engine to refuse (an AttributeError was a body-less 500)
    odd = json.dumps({"response_format": {"type": "json_schema", "json_schema": "observation"}}).encode()
    assert openai_request(odd) == odd
    assert openai_request(b"not json") == b"not json"  # the server refuses it with its own error


@needs_llama_cpp
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "the request body is not JSON"),
        (b"[1]", "the request body is not a JSON object"),
        (b'{"messages": "hi"}', "messages: Input should be a valid list"),
        (b'{"messages": [{"role": "user", "content": "x"}], "response_format": "text"}', "response_format"),
    ],
)
def test_a_request_llama_cpp_python_cannot_read_is_a_400_not_its_500(body, message):
    """llama-cpp-python's error handler answers a request its own types refuse with HTTP 500 (a body that is no
    JSON: an unhandled exception in the app); OpenAI's API answers 400 `invalid_request_error`, and a client retries
    a 500 (ours three times, then skips the engine). The wrapper refuses such a body before the app sees it."""
    import asyncio

    from mirrorapi.llama_cpp_engine import OpenAIDialect

    async def never(scope, receive, send):
        raise AssertionError("llama-cpp-python's app was asked")

    sent: list[dict] = []

    async def run():
        async def receive():
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
        await OpenAIDialect(never)(scope, receive, send)

    asyncio.run(run())
    assert sent[0]["status"] == 400
    error = json.loads(sent[1]["body"])["error"]
    assert error["type"] == "invalid_request_error" and message in error["message"]


def test_a_base_gguf_is_parsed_once_and_again_when_replaced_or_rewritten(tmp_path):
    import gguf

    def write(path: Path, name: str) -> None:  # a GGUF with metadata only, written by the gguf package itself
        writer = gguf.GGUFWriter(path, "llama")
        writer.add_name(name)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    base = tmp_path / "base.gguf"
    write(base, "first")
    first = read_base_gguf(base)
    assert first.fields["general.name"].contents() == "first"
    assert read_base_gguf(tmp_path / "." / "base.gguf") is first  # the same file, however spelt: parsed once
    write(tmp_path / "next.gguf", "second")
    os.replace(tmp_path / "next.gguf", base)  # how `models get` puts a new download in place
    assert read_base_gguf(base).fields["general.name"].contents() == "second"
    write(base, "third, rewritten in place")
    assert read_base_gguf(base).fields["general.name"].contents() == "third, rewritten in place"


def test_a_lora_adapter_folder_is_refused_with_a_reason(tmp_path):
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(GGUFExportError, match="LoRA adapter: merge it first"):
        export_gguf(tmp_path, tmp_path / "out.gguf", tmp_path / "base.gguf")


def test_weights_cut_short_are_one_line(tmp_path):
    """A safetensors file a copy or a save left cut short: the export says which file (it was safetensors' own
    traceback)."""
    from mirrorapi.models.to_gguf import _tensors

    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header[:10])
    with pytest.raises(GGUFExportError, match="model.safetensors: not a whole safetensors file"):
        list(_tensors(tmp_path))


# ------------------------------------------------------------------------------------ slow: real weights
def simulator_prompts(samples, n: int) -> list[list[dict]]:
    registry = ToolRegistry.load([samples / "tools"])
    prompts = []
    for pair in read_pairs_jsonl(samples / "pairs.jsonl"):
        doc = registry.resolve(pair["category"], pair["tool_name"], pair["api_name"])
        prompts.append(simulator_messages(doc, pair["tool_input"]))
        if len(prompts) == n:
            return prompts
    return prompts


@pytest.fixture(scope="module")
def changed_smollm2(smollm2_dir, tmp_path_factory):
    """A stand-in for a fine-tune (the export must not depend on how weights changed): every matrix of the
    base moved by seeded noise, saved in float32 as a trainer saves it, with the base's tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path_factory.mktemp("finetune") / "model"
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim == 2:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * parameter.std() * 0.05)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(smollm2_dir).save_pretrained(out)
    # the Hugging Face model-card field our training cards write (mirrorapi.training.model_card)
    (out / "README.md").write_text(f"---\nbase_model: {smollm2_dir}\nlibrary_name: transformers\n---\n# fine-tune\n")
    yield out
    shutil.rmtree(out)  # 775 MB, needed by this module only


@pytest.mark.slow
def test_a_folder_of_another_model_is_refused(smollm2_dir, tiny_model_dir, tmp_path):
    with pytest.raises(GGUFExportError, match="only llama fine-tunes"):
        export_gguf(tiny_model_dir, tmp_path / "out.gguf", base_gguf(smollm2_dir))
    assert not list(tmp_path.iterdir())
    with pytest.raises(GGUFExportError, match="no GGUF to take the tokenizer from"):
        gguf_for_serving(tiny_model_dir)


@pytest.mark.slow
def test_the_served_gguf_of_a_base_and_of_its_fine_tune(smollm2_dir, changed_smollm2, capsys):
    """A base model is served from its original GGUF; a fine-tune naming it as base_model is exported once
    (f16) into its folder, and exported again only when its weights change."""
    import gguf

    assert gguf_for_serving(smollm2_dir) == base_gguf(smollm2_dir)
    assert main(["models", "gguf", str(changed_smollm2)]) == 0
    exported = Path(capsys.readouterr().out.strip())
    assert exported == changed_smollm2 / "model-f16.gguf"
    reader = gguf.GGUFReader(exported)
    base = read_base_gguf(base_gguf(smollm2_dir))  # as the export read it (parsed once per process)
    assert reader.fields["tokenizer.ggml.tokens"].contents() == base.fields["tokenizer.ggml.tokens"].contents()
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == "F16" and types["blk.0.attn_norm.weight"] == "F32"
    assert "output.weight" not in types  # tied: llama.cpp reuses token_embd
    written = exported.stat().st_mtime_ns
    assert gguf_for_serving(changed_smollm2) == exported and exported.stat().st_mtime_ns == written
    assert main(["models", "gguf", str(smollm2_dir.parent / "nothing")]) == 2  # the user's error
    assert "not a model folder" in capsys.readouterr().err


@pytest.mark.slow
@needs_llama_cpp
def test_llama_cpp_answers_what_transformers_answers(changed_smollm2, samples, tmp_path):
    """The fine-tune served as the demo serves it (`cpu_engine_serve`: exported to f16 GGUF, llama.cpp) gives
    transformers' greedy answers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    prompts = simulator_prompts(samples, 3)
    tokenizer = AutoTokenizer.from_pretrained(changed_smollm2)
    model = AutoModelForCausalLM.from_pretrained(changed_smollm2).eval()
    expected = []
    for messages in prompts:
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=48, do_sample=False)
        expected.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))
    with cpu_engine_serve(changed_smollm2, log_path=tmp_path / "engine.log") as engine:
        assert "mirrorapi.llama_cpp_engine" in engine.process.args and engine.model == str(changed_smollm2)
        client = EngineClient([engine.base_url], engine.model, timeout=120)
        got = asyncio.run(_answers(client, prompts, 48))
    assert got == expected
    assert len({*expected}) == 3 and all(expected)  # three different, non-empty answers were compared


async def _answers(client, prompts, max_tokens, **kwargs):
    try:
        return [
            await client.chat(messages, max_tokens=max_tokens, temperature=0, seed=0, **kwargs) for messages in prompts
        ]
    finally:
        await client.aclose()


@pytest.mark.slow
@needs_llama_cpp
def test_grammar_checked_greedy_answers_are_those_of_the_grammar_over_every_token(smollm2_dir, samples, monkeypatch):
    """The engine's greedy sampling under a grammar (GrammarCheckedGreedy: the likeliest token offered to the grammar
    first) writes the tokens of llama-cpp-python's own chain (the grammar over the whole vocabulary, then the
    likeliest), on SmolLM2's real weights: with the observation schema, and with a schema whose only values the
    model would not write (so the grammar refuses its likeliest token and the whole-vocabulary path decides)."""
    from llama_cpp import Llama

    refusing = {
        "type": "object",
        "properties": {"error": {"enum": ["quota exceeded"]}, "response": {"enum": ["zebra crossing", 17]}},
        "required": ["error", "response"],
    }
    asks = [(p, explicit_any(OBSERVATION_SCHEMA)) for p in simulator_prompts(samples, 3)]
    asks.append((asks[0][0], refusing))

    def answers() -> list[str]:
        # a model loaded afresh for each pass: llama.cpp reuses the KV cache of the previous prompt's common
        # prefix, and a prompt read in other pieces may tip a close choice
        llm = Llama(model_path=str(base_gguf(smollm2_dir)), n_ctx=2048, n_threads=2, verbose=False)
        return [
            llm.create_chat_completion(
                messages=messages,
                response_format={"type": "json_object", "schema": schema},
                temperature=0,
                max_tokens=96,
                repeat_penalty=1.0,
            )["choices"][0]["message"]["content"]
            for messages, schema in asks
        ]

    whole_vocabulary = answers()
    refused = []
    apply_grammar = GrammarCheckedGreedy._apply_grammar

    def counting(self, data, size):
        apply_grammar(self, data, size)
        refused.append(size > 1)

    monkeypatch.setattr(Llama, "_init_sampler", Llama._init_sampler)  # undone after the test
    monkeypatch.setattr(GrammarCheckedGreedy, "_apply_grammar", counting)
    check_grammar_first()
    checked_first = answers()
    assert checked_first == whole_vocabulary
    assert json.loads(checked_first[-1]) == {"error": "quota exceeded", "response": "zebra crossing"} or json.loads(
        checked_first[-1]
    ) == {"error": "quota exceeded", "response": 17}
    assert any(refused) and refused.count(False) > refused.count(True)  # both paths ran; the check alone mostly
    assert len(set(whole_vocabulary[:3])) == 3 and all(len(a) > 20 for a in whole_vocabulary)
    # Only a greedy request without penalties gets it: a sampled one (the server's second try) or one with a
    # penalty keeps llama-cpp-python's chain, where checking one token first would change what is drawn.
    from llama_cpp import LlamaGrammar

    grammar = LlamaGrammar.from_json_schema(json.dumps(refusing), verbose=False)
    llm = Llama(model_path=str(base_gguf(smollm2_dir)), n_ctx=256, verbose=False)
    kinds = {
        "greedy": llm._init_sampler(temp=0.0, grammar=grammar),
        "sampled": llm._init_sampler(temp=0.7, grammar=grammar),
        "penalised": llm._init_sampler(temp=0.0, repeat_penalty=1.1, grammar=grammar),
        "no grammar": llm._init_sampler(temp=0.0),
    }
    assert [k for k, sampler in kinds.items() if isinstance(sampler, GrammarCheckedGreedy)] == ["greedy"]


@pytest.mark.slow
@needs_llama_cpp
def test_the_cpu_engine_script_serves_a_base_model_with_llama_cpp(smollm2_dir, samples, tmp_path):
    """scripts/serve_engine_cpu.sh on a base folder (given relative, through a link, as runs/demo/latest is)
    starts llama.cpp on its GGUF, under the name it prints; what the virtual server needs from it: /v1/models
    names the model (its /health), the observation schema as `response_format` is enforced, streaming
    answers, and a second identical greedy request gets the same answer."""
    import httpx
    from openai import OpenAI

    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "latest").symlink_to(smollm2_dir.parent)
    relative = f"runs/latest/{smollm2_dir.name}"
    name = f"{tmp_path}/{relative}"  # what "$PWD/runs/latest/<model>" expands to there
    port, log = free_port(), tmp_path / "engine.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(REPO / "scripts" / "serve_engine_cpu.sh"), relative, str(port)],
            cwd=tmp_path,
            env={**os.environ, "ENGINE": "llama.cpp", "PYTHON": sys.executable},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        engine = RunningEngine(f"http://127.0.0.1:{port}/v1", name, process, log)
        wait_until_engine_answers(engine, 180)
        assert f"model name (clients' --model): {name}" in log.read_text()
        assert f"llama.cpp on {name}/{base_gguf(smollm2_dir).name}" in log.read_text()
        listed = httpx.get(engine.base_url + "/models", timeout=10).json()
        assert [m["id"] for m in listed["data"]] == [name]
        prompts = simulator_prompts(samples, 2)
        schema_format = {"type": "json_schema", "json_schema": {"name": "observation", "schema": OBSERVATION_SCHEMA}}
        client = EngineClient([engine.base_url], name, timeout=300)
        structured = asyncio.run(_answers(client, prompts, 160, response_format=schema_format))
        client = EngineClient([engine.base_url], name, timeout=300)
        plain = asyncio.run(_answers(client, [prompts[0]] * 2, 32))
        openai = OpenAI(base_url=engine.base_url, api_key="none", max_retries=0)
        chunks = [
            c.choices[0].delta.content or ""
            for c in openai.chat.completions.create(
                model=name, messages=prompts[0], max_tokens=16, temperature=0, stream=True
            )
            if c.choices
        ]
    finally:
        stop(process)
    # With the schema, one object of the two keys (an answer cut by max_tokens is the only way not to be one).
    complete = [a for a in structured if a.rstrip().endswith("}")]
    assert complete and all(is_strict_observation(a) for a in complete)
    assert plain[0] == plain[1]
    assert len([c for c in chunks if c]) > 1 and "".join(chunks) == plain[0][: len("".join(chunks))]


def test_the_chat_template_is_read_where_transformers_reads_it(tmp_path):
    """transformers reads a folder's template from `chat_template.jinja`, else from tokenizer_config.json (where
    transformers 4.x and many hub folders keep it); the export read only the first and fell back to the base's
    template, so llama.cpp built other prompts than transformers. TRL's generation markers are dropped either way."""
    from mirrorapi.models.to_gguf import _chat_template

    template = "{% for m in messages %}<{{ m.role }}>{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    read = _chat_template(tmp_path)
    assert read == template.replace("{% generation %}", "").replace("{% endgeneration %}", "")
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0].content }}")  # this file first, as transformers
    assert _chat_template(tmp_path) == "{{ messages[0].content }}"


def test_a_base_named_by_its_catalogue_name_is_the_folder_models_get_made(tmp_path, monkeypatch):
    """A merged folder's card names its base `smollm2-135m-instruct` (a shipped adapter's record): that is the
    folder `mirrorapi models get` makes in the models folder, wherever the command runs (it was looked up in the
    working folder, and the export said the base was "not named")."""
    from mirrorapi.models.catalogue import MODELS_DIR_ENV
    from mirrorapi.models.to_gguf import _base_model_of

    models = tmp_path / "models"
    (models / "smollm2-135m-instruct").mkdir(parents=True)
    monkeypatch.setenv(MODELS_DIR_ENV, str(models))
    merged = tmp_path / "merged"
    merged.mkdir()
    (merged / "README.md").write_text("---\nbase_model: smollm2-135m-instruct\n---\n# a merge\n")
    assert _base_model_of(merged) == ("smollm2-135m-instruct", models / "smollm2-135m-instruct")


def test_a_folder_without_a_base_gguf_is_told_why(tmp_path, monkeypatch):
    """`mirrorapi models gguf` (and the CPU engine script) on a folder it cannot export: the message names what its
    card says (it said "not named in README.md" of a card naming a base that is not a local folder) and an adapter
    is told to be merged first."""
    from mirrorapi.models.catalogue import MODELS_DIR_ENV
    from mirrorapi.models.to_gguf import GGUFExportError, gguf_for_serving

    monkeypatch.setenv(MODELS_DIR_ENV, str(tmp_path / "models"))
    cases = {
        "hub-named": (
            "---\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct\n---\n",
            "config.json",
            "its base model HuggingFaceTB/SmolLM2-135M-Instruct is not a folder made by `mirrorapi models get`",
        ),
        "unnamed": ("# no front matter\n", "config.json", "its README.md names no base_model"),
        "adapter": (
            "---\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct\n---\n",
            "adapter_config.json",
            "is a LoRA adapter: merge it first",
        ),
    }
    for name, (card, config, message) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "README.md").write_text(card)
        (folder / config).write_text("{}")
        with pytest.raises(GGUFExportError, match=re.escape(message)):
            gguf_for_serving(folder)
