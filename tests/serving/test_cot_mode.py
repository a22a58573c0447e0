"""MirrorAPI's chain-of-thought mode (prompt format `stabletoolbench-cot`), against StableToolBench's own text.

COT_SYSTEM below is transcribed (its long lines kept as they are) from StableToolBench
`server/system_prompts.py` (`COT_SYSTEM`), commit
aa4ed9f4737ad98bd706663f01d63623c3427812 (Apache-2.0): its first line is the tag that switches MirrorAPI to CoT,
and its example answer (not valid JSON: inner quotes unescaped) is what a CoT model writes. The user message is
the `stabletoolbench` layout (server/main_mirrorapi.py at the same commit; notes section 4).
"""

import asyncio
import contextlib
import json

import httpx
import pytest
from fastapi import FastAPI

from harness.processes import free_port, serve_in_thread
from mirrorapi.engine_client import Completion
from mirrorapi.prompts.simulator_formats import simulator_messages
from mirrorapi.prompts.simulator_output import cot_rationale, parse_simulator_output
from mirrorapi.serving.app import create_app
from mirrorapi.serving.cache import ResponseCache
from mirrorapi.serving.config import ServerSettings, load_settings
from mirrorapi.serving.simulator import Simulator, simulator_identity
from mirrorapi.tools import ToolRegistry

COT_SYSTEM = """\
[CHAIN_OF_THOUGHT]
You are an API Server operating within a specialized tool, tasked with understanding the purpose of each API based on provided documentation. Your job is to process specific API inputs and craft a well-formatted response reflecting the API's intended functionality. You should first infer the mechanism behind the API and then provide your response based on the input parameters.

Your response must follow this JSON structure:

{
    "mechanism_of_the_api": "",
    "error": "",
    "response": ""
}

* MECHANISIM OF THE API: Try to infer how the API functions based on the input parameters.
* ERROR: Leave empty unless there's an issue with the input.
* RESPONSE: Provide content based on the API's function. If examples are ineffective, give an independent, meaningful response.

Note:
* Ensure responses are practical, clear, and relevant.
* Handle incorrect input gracefully by explaining expected behavior.

Example:

API doc:

{
    "api_name": "List Languages",
    "api_description": "Get a list of currently supported languages. We are constantly adding more every few weeks.",
    "required_parameters": [],
    "optional_parameters": [],
    "tool_description": "Introducing our cutting-edge text to speech service, designed to provide you with the most realistic human-sounding voices at an affordable price. Our service is fast and reliable, delivering high-quality audio output in a matter of seconds. Additionally, we offer a wide range of languages and a variety of voice choices, so you can find the perfect fit for your project. Whether you need a voiceover for a video, an audiobook, or any other project, our text to speech service has you covered. Ex...",
    "tool_name": "TTSKraken",
    "tool_category": "Artificial_Intelligence_Machine_Learning"
}
Request:

data = {
    "category": "Artificial_Intelligence_Machine_Learning",
    "tool_name": "TTSKraken",
    "api_name": "List Languages",
    "tool_input": "{}",
    "strip": "filter",
    } 

Response:
    {
        "mechanism_of_the_api": "The "List Languages" API for the TTSKraken service returns a list of supported languages for their text-to-speech offerings. It performs a straightforward operation by querying a dynamic data source, likely a database, which stores language information. When the API is invoked, it retrieves all available languages without requiring additional parameters. The list of languages is formatted as a JSON response, as indicated by the example response showing language codes such as "en" for English and "fr-fr" for French. This mechanism allows users to understand what languages the TTSKraken service supports, aligning with the tool's goal of providing diverse, high-quality voice options.",
        "error": "",
        "response": "{"status":0,"msg":"Success","languages":["en","fr-fr","pt-br"]}" 
    }

Ensure responses are directly aligned with the API's intended output and maintain correct formatting.
"""

# The example answer inside COT_SYSTEM, as a CoT model writes it (from "Response:" to the closing brace).
UPSTREAM_ANSWER = COT_SYSTEM[
    COT_SYSTEM.index("Response:") + len("Response:") : COT_SYSTEM.index("Ensure responses are directly")
].strip()
UPSTREAM_MECHANISM = (
    'The "List Languages" API for the TTSKraken service returns a list of supported languages for '
    "their text-to-speech offerings."
)


def test_cot_prompt_is_upstreams_system_prompt_and_request_layout(samples, tmp_path):
    (tmp_path / "cot.txt").write_text(COT_SYSTEM, encoding="utf-8")
    settings = load_settings(
        overrides={
            "tools_folder": [str(samples / "tools")],
            "prompt_format": "stabletoolbench-cot",
            "system_prompt_file": str(tmp_path / "cot.txt"),
        },
        environ={},
    )
    doc = ToolRegistry.load([samples / "tools"]).resolve("Logistics", "transitaires", "transitaire")
    messages = simulator_messages(
        doc, {"is_id": "EKVF"}, fmt="stabletoolbench-cot", system_prompt=settings.system_prompt()
    )
    assert messages == [
        {"role": "system", "content": COT_SYSTEM},
        {
            "role": "user",
            "content": "API doc:\n{'api_name': 'Transitaire', 'api_description': 'Récupère un transitaire donnée', "
            "'required_parameters': [{'name': 'id', 'type': 'string', 'description': '', "
            "'default': 'DOUANE_AGENCE_GONDRAND'}], 'optional_parameters': [], "
            "'tool_description': 'Transitaires de dédouanement en Nouvelle-Calédonie ', "
            "'tool_name': 'transitaires', "
            "'tool_category': 'Logistics'}\n\nRequest:\n{'is_id': 'EKVF'}",
        },
    ]
    # The simulator identity names the mode, so CoT answers are never served as plain ones (or back).
    assert "@stabletoolbench-cot," in simulator_identity(settings)
    # upstream's request settings, as for the other stabletoolbench formats
    assert (settings.seed, settings.max_tokens, settings.structured_output) == (42, 2048, False)


def test_a_system_prompt_without_the_tag_is_refused_at_start(samples, tmp_path):
    (tmp_path / "sft.txt").write_text(COT_SYSTEM.replace("[CHAIN_OF_THOUGHT]\n", ""), encoding="utf-8")
    with pytest.raises(ValueError, match="CHAIN_OF_THOUGHT"):
        ServerSettings(
            tools_folder=[samples / "tools"],
            prompt_format="stabletoolbench-cot",
            system_prompt_file=tmp_path / "sft.txt",
        )


def test_upstreams_example_answer_gives_the_observation_and_the_rationale():
    observation, _ = parse_simulator_output(UPSTREAM_ANSWER)
    assert observation["error"] == ""
    assert "mechanism_of_the_api" not in observation
    assert '"languages":["en","fr-fr","pt-br"]' in json.dumps(observation["response"]).replace("\\", "")
    assert cot_rationale(UPSTREAM_ANSWER).startswith(UPSTREAM_MECHANISM)
    assert cot_rationale(json.dumps({"mechanism_of_the_api": "m", "error": "", "response": "r"})) == "m"
    assert cot_rationale('{"error": "", "response": "r"}') == ""
    # UTF-8 as the observation is: a lone surrogate once failed the store's write (and every write of its turn)
    assert cot_rationale('{"mechanism_of_the_api": "m \\ud83d", "error": "", "response": "r"}') == "m \ufffd"
    # the engine's text itself holding one (its JSON escape decoded), read by the regex (unescaped quotes)
    assert cot_rationale('{"mechanism_of_the_api": "it "reads" \ud83d", "error": "", "response": "r"}') == (
        'it "reads" \ufffd'
    )


@contextlib.contextmanager
def cot_engine(answer: str):
    """A stand-in for an OpenAI-compatible engine serving a CoT model: always `answer`."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat() -> dict:
        return {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "cot",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    port = free_port()
    with serve_in_thread(app, port, access_log=False) as url:
        yield url + "/v1"


def test_the_server_in_cot_mode_answers_error_and_response_and_logs_the_rationale(samples, tmp_path):
    (tmp_path / "cot.txt").write_text(COT_SYSTEM, encoding="utf-8")
    answer = json.dumps(
        {
            "mechanism_of_the_api": "Looks the forwarder up by its id.",
            "error": "",
            "response": {"name": "EKVF", "city": "Nouméa"},
        }
    )
    with cot_engine(answer) as engine:
        port = free_port()
        settings = ServerSettings(
            api_base=engine,
            model="cot",
            tools_folder=[samples / "tools"],
            port=port,
            prompt_format="stabletoolbench-cot",
            system_prompt_file=tmp_path / "cot.txt",
            cache_path=tmp_path / "cache.sqlite",
            log_file=tmp_path / "requests.log",
            log_level="warning",
        )
        with serve_in_thread(create_app(settings), port, timeout=60, access_log=False) as url:
            body = {
                "category": "Logistics",
                "tool_name": "transitaires",
                "api_name": "transitaire",
                "tool_input": json.dumps({"is_id": "EKVF"}),
            }
            reply = httpx.post(url + "/virtual", json=body, timeout=30).json()
            again = httpx.post(url + "/virtual", json=body, timeout=30).json()  # from the cache
    assert reply == again == {"error": "", "response": {"name": "EKVF", "city": "Nouméa"}}
    lines = [json.loads(line) for line in (tmp_path / "requests.log").read_text().splitlines()]
    assert [line["outcome"] for line in lines] == ["simulated", "hit"]
    assert lines[0]["rationale"] == "Looks the forwarder up by its id."
    assert "@stabletoolbench-cot," in lines[0]["provenance"] and lines[1]["provenance"] == lines[0]["provenance"]
    # the stored answer is the observation alone: the rationale never reaches an agent, not even from the cache;
    # it is kept beside the answer's provenance (schema version 4)
    cache = ResponseCache(tmp_path / "cache.sqlite")
    try:
        (entry,) = list(cache.rows())
    finally:
        cache.close()
    assert json.loads(entry.observation) == reply and "Looks the forwarder" not in entry.observation
    assert entry.rationale == "Looks the forwarder up by its id." and entry.provenance == lines[0]["provenance"]


def test_the_simulator_keeps_the_rationale_apart(samples, tmp_path):
    (tmp_path / "cot.txt").write_text(COT_SYSTEM, encoding="utf-8")
    settings = load_settings(
        overrides={
            "tools_folder": [str(samples / "tools")],
            "is_save": False,
            "prompt_format": "stabletoolbench-cot",
            "system_prompt_file": str(tmp_path / "cot.txt"),
        },
        environ={},
    )

    class Engine:  # stand-in: answers upstream's example
        async def complete(self, messages, **settings):
            return Completion({"role": "assistant", "content": UPSTREAM_ANSWER}, {}, "stop")

    doc = ToolRegistry.load([samples / "tools"]).resolve("Logistics", "transitaires", "transitaire")
    observation, _, rationale, _ = asyncio.run(Simulator(Engine(), settings=settings).simulate(doc, {}))
    assert rationale.startswith(UPSTREAM_MECHANISM)
    assert set(observation) == {"error", "response"}


def test_train_cot_records_become_cot_sft_records(samples, tmp_path):
    """MirrorAPI's train_cot.json layout (alpaca instruction/input/output): the CoT system prompt as instruction
    (its own example holds an `API doc:`), the doc and request as input, the CoT answer as output."""
    from mirrorapi.data.simulator_sft import SimulatorDataOptions, build_simulator_records
    from mirrorapi.data.sources import read_alpaca

    doc = (
        "{'api_name': 'Transitaire', 'api_description': 'Récupère un transitaire donnée', "
        "'required_parameters': [{'name': 'id', 'type': 'string', 'description': '', 'default': 'X'}], "
        "'optional_parameters': [], 'tool_description': 'Transitaires', 'tool_name': 'transitaires', "
        "'tool_category': 'Logistics'}"
    )
    cot = {
        "instruction": COT_SYSTEM,
        "input": f"API doc:\n{doc}\n\nRequest:\n{{'id': 'EKVF'}}",
        "output": '{"mechanism_of_the_api": "Looks the forwarder up.", "error": "", "response": "Gondrand"}',
    }
    plain = {
        **cot,
        "input": f"API doc:\n{doc}\n\nRequest:\n{{'id': 'OTHER'}}",
        "output": '{"error": "", "response": "Other"}',
    }
    path = tmp_path / "train_cot.json"
    path.write_text(json.dumps([cot, plain]), encoding="utf-8")
    pairs = list(read_alpaca(path))
    assert [p.get("rationale") for p in pairs] == ["Looks the forwarder up.", None]
    assert pairs[0]["tool_input"] == {"id": "EKVF"} and pairs[0]["response"] == {"error": "", "response": "Gondrand"}

    options = SimulatorDataOptions(
        prompt_format="stabletoolbench-cot", system_prompt=COT_SYSTEM, ood_fraction=0.0, id_fraction=0.0
    )
    splits, stats = build_simulator_records(pairs, ToolRegistry.load([samples / "tools"]), options)
    assert stats["dropped"]["no_rationale"] == 1
    (record,) = splits["train"]
    assert record["prompt"][0] == {"role": "system", "content": COT_SYSTEM}
    assert record["prompt"][1]["content"].startswith("API doc:\n{'api_name': 'Transitaire'")
    assert json.loads(record["completion"][0]["content"]) == {
        "mechanism_of_the_api": "Looks the forwarder up.",
        "error": "",
        "response": "Gondrand",
    }
    assert record["completion"][0]["content"].startswith('{"mechanism_of_the_api":')  # upstream's key order
    with pytest.raises(ValueError, match="CHAIN_OF_THOUGHT"):
        SimulatorDataOptions(prompt_format="stabletoolbench-cot", system_prompt="no tag").check()
