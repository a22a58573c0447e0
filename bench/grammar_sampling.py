"""llama.cpp's greedy answers under the virtual server's grammar, sampled two ways side by side; prints JSON.

    .venv/bin/python bench/grammar_sampling.py [--model-dir DIR] [--prompts 24] [--max-tokens 576] [--out FILE]

Two llama.cpp servers (`mirrorapi.llama_cpp_engine`, every core, started once each) on the same GGUF:
- `checked_first` (the engine's default): the grammar is asked about the likeliest token first
  (`GrammarCheckedGreedy`), and applied to the whole vocabulary only when it refuses it;
- `whole_vocabulary` (`--check_grammar_first false`): llama-cpp-python's own chain, the grammar over every token
  at every step.
Workload: the simulator prompts of the first distinct APIs of data/samples/pairs.jsonl, in the model's prompt
format, each with the `response_format` the virtual server sends for that API, temperature 0, one request at a
time. Each prompt goes to both servers in turn (which one first alternates), so the load of the machine falls on
both alike. Reported per way: seconds, completion tokens, milliseconds per completion token (prompt reading
included); `identical_answers`: prompts whose two answers are the same text; `speedup`: whole_vocabulary's
seconds over checked_first's.
Default model: the shipped simulator (`mirrorapi models get smollm2-135m-mirrorapi-simulator`).
"""

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))  # bench/engines.py, however this script is started

from engines import sample_calls  # noqa: E402
from server_load import load_average  # noqa: E402

from harness.processes import llama_cpp_available, llama_cpp_serve  # noqa: E402
from mirrorapi.models.shipped import get_shipped_model  # noqa: E402
from mirrorapi.models.to_gguf import gguf_for_serving  # noqa: E402
from mirrorapi.prompts.simulator_formats import DEFAULT_SIMULATOR_FORMAT, simulator_messages  # noqa: E402
from mirrorapi.serving.config import model_record_settings  # noqa: E402
from mirrorapi.serving.simulator import response_format  # noqa: E402
from mirrorapi.versions import package_versions  # noqa: E402

WAYS = {"checked_first": ["--check_grammar_first", "true"], "whole_vocabulary": ["--check_grammar_first", "false"]}


def requests(limit: int, prompt_format: str) -> list[tuple[list[dict], dict]]:
    """(messages, response_format) of the first `limit` distinct APIs of the samples, as the server asks them."""
    return [
        (simulator_messages(doc, arguments, fmt=prompt_format), response_format(doc, prompt_format))
        for doc, arguments in sample_calls(limit)
    ]


async def ask(client, model: str, messages, fmt, max_tokens: int) -> tuple[float, int, str]:
    started = time.perf_counter()
    answer = await client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=max_tokens, response_format=fmt
    )
    return time.perf_counter() - started, answer.usage.completion_tokens, answer.choices[0].message.content or ""


async def side_by_side(engines: dict, work: list, max_tokens: int) -> dict:
    from openai import AsyncOpenAI

    clients = {
        way: AsyncOpenAI(base_url=e.base_url, api_key="none", max_retries=0, timeout=600) for way, e in engines.items()
    }
    totals = {way: {"seconds": 0.0, "completion_tokens": 0} for way in engines}
    identical = 0
    for n, (messages, fmt) in enumerate(work):
        order = list(engines) if n % 2 == 0 else list(reversed(engines))
        answers = {}
        for way in order:
            seconds, tokens, answers[way] = await ask(clients[way], engines[way].model, messages, fmt, max_tokens)
            totals[way]["seconds"] += seconds
            totals[way]["completion_tokens"] += tokens
        identical += len(set(answers.values())) == 1
    for client in clients.values():
        await client.close()
    for row in totals.values():
        row["ms_per_completion_token"] = round(1000 * row["seconds"] / max(row["completion_tokens"], 1), 1)
        row["seconds"] = round(row["seconds"], 1)
    return {
        "ways": totals,
        "identical_answers": f"{identical}/{len(work)}",
        "speedup": round(totals["whole_vocabulary"]["seconds"] / max(totals["checked_first"]["seconds"], 1e-9), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--model-dir", help="a model folder llama.cpp serves (default: the shipped simulator)")
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=576)
    parser.add_argument("--out", help="Also write the JSON here.")
    args = parser.parse_args()
    if not llama_cpp_available():
        print("llama-cpp-python[server] is not installed: make engine", file=sys.stderr)
        return 1
    model_dir = Path(args.model_dir) if args.model_dir else get_shipped_model("smollm2-135m-mirrorapi-simulator")
    gguf = gguf_for_serving(model_dir)
    prompt_format = model_record_settings(str(model_dir)).get("prompt_format", DEFAULT_SIMULATOR_FORMAT)
    work = requests(args.prompts, prompt_format)
    with (
        llama_cpp_serve(gguf, "checked", extra_args=WAYS["checked_first"]) as checked,
        llama_cpp_serve(gguf, "whole", extra_args=WAYS["whole_vocabulary"]) as whole,
    ):
        load_before = load_average()
        result = asyncio.run(
            side_by_side({"checked_first": checked, "whole_vocabulary": whole}, work, args.max_tokens)
        )
    result.update(
        model=str(model_dir),
        gguf=gguf.name,
        prompt_format=prompt_format,
        prompts=len(work),
        max_tokens=args.max_tokens,
        load_average_before=load_before,
        load_average_after=load_average(),
        versions=package_versions(),
    )
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
