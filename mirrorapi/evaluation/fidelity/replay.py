"""Simulator fidelity: replay real held-out calls through a running virtual server and compare.

Calls go to `POST /virtual` with the body StableToolBench's agents send: each alone, several at once; in a
session (`history` on), each episode's calls in `step` order (stateful APIs; episodes run concurrently).
Every simulated observation is compared with the real one, and so is a baseline: the nearest example,
i.e. the real response of the most similar training call of the same API (`--baseline-pairs`), so a
simulator has something real to beat. Metrics (all in %, see `metrics.slice_metrics`) are given
overall, per source and per API.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import aiohttp
from tqdm import tqdm

from mirrorapi.evaluation.fidelity.carried_values import EpisodeValues
from mirrorapi.evaluation.fidelity.metrics import Embedder, FidelityError, api_id, build_report, compare
from mirrorapi.evaluation.fidelity.report import write_report
from mirrorapi.evaluation.fidelity.session_history import (
    heldout_episodes,
    history_report,
    render_history_markdown,
    some_episodes,
)
from mirrorapi.evaluation.fidelity.settings import FidelitySettings
from mirrorapi.few_shot import argument_similarity
from mirrorapi.records import SourceError, read_pairs_jsonl
from mirrorapi.tools import RegistryError, ToolRegistry

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------- inputs
def load_pairs(paths: Sequence[str]) -> list[dict]:
    """Pairs of the given JSONL files in replay order (source, episode, step); bad lines are logged and skipped."""
    pairs: list[dict] = []
    seen: dict[tuple, str] = {}
    for path in paths:
        try:
            for pair in read_pairs_jsonl(path, on_bad=lambda reason: logger.warning("skipping pair %s", reason)):
                if _pair_id(pair) in seen:  # scored twice it would weigh twice in every row
                    raise FidelityError(
                        f"{path}: call {_pair_id(pair)} (source, episode, step) is already in {seen[_pair_id(pair)]}"
                    )
                seen[_pair_id(pair)] = str(path)
                pairs.append(pair)
        except SourceError as exc:
            raise FidelityError(str(exc)) from exc
    if not pairs:
        raise FidelityError("no usable pairs in " + ", ".join(map(str, paths)))
    return sorted(pairs, key=lambda p: (p["source"], p["episode"], p["step"]))


def _pair_id(pair: dict) -> tuple:
    return pair["source"], pair["episode"], pair["step"]


# ----------------------------------------------------------------------------------- baseline
class NearestExample:
    """The response of the most similar training call of the same API (ties: the earliest in the training list)."""

    def __init__(self, train_pairs: list[dict], held_out: list[dict]):
        held = {_pair_id(p) for p in held_out}
        self.by_api: dict[tuple, list[dict]] = defaultdict(list)
        leaked = 0
        for pair in train_pairs:
            if _pair_id(pair) in held:  # the very call being scored must not be its own baseline
                leaked += 1
                continue
            self.by_api[api_id(pair)].append(pair)
        if leaked:
            logger.warning("baseline: %d training pairs are also held-out pairs; they are not used", leaked)

    def __call__(self, pair: dict) -> dict | None:
        candidates = self.by_api.get(api_id(pair))
        if not candidates:
            return None
        best = max(candidates, key=lambda c: argument_similarity(pair["tool_input"], c["tool_input"]))
        return best["response"]


# ------------------------------------------------------------------------------------- replay
# The headers a mirrorapi server sends with every /virtual answer (mirrorapi.serving.protocol; this package may not
# import the serving stage, so they are named again here, and tests/eval/test_fidelity.py reads them off a server).
OUTCOME_HEADER = "x-mirrorapi-outcome"
PROVENANCE_HEADER = "x-mirrorapi-provenance"


def virtual_url(server: str) -> str:
    server = server.rstrip("/")
    return server if server.endswith("/virtual") else server + "/virtual"


def request_body(pair: dict) -> dict:
    """What StableToolBench's agents post (notes §6): arguments as a raw JSON string."""
    return {
        "category": pair["category"],
        "tool_name": pair["tool_name"],
        "api_name": pair["api_name"],
        "tool_input": json.dumps(pair["tool_input"], ensure_ascii=False),
        "strip": "truncate",
        "toolbench_key": "",
    }


async def _post(client: aiohttp.ClientSession, url: str, pair: dict, session: str | None = None) -> dict:
    try:
        async with client.post(
            url, json=request_body(pair), headers={"X-Session-Id": session} if session else None
        ) as answer:
            status, text = answer.status, await answer.text()
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return {"error": f"request failed: {type(exc).__name__}: {exc}", "response": "", "failed": True}
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if status != 200 or not isinstance(body, dict) or "error" not in body:
        return {"error": f"HTTP {status}: {text[:200]}", "response": "", "failed": True}
    error = body.get("error")
    # How the server answered (its headers; absent from a server that does not say: then None).
    provenance = answer.headers.get(PROVENANCE_HEADER)
    return {
        **body,
        # null is no error, as the project reads an observation everywhere (`records.observation_json`): a
        # StableToolBench server passes a model's `"error": null` through, and "null" scored every call a failure
        "error": error if isinstance(error, str) else "" if error is None else json.dumps(error),
        "response": body.get("response", ""),
        "outcome": answer.headers.get(OUTCOME_HEADER),
        "provenance": urllib.parse.unquote(provenance) if provenance is not None else None,
    }


async def replay(
    pairs: list[dict],
    server: str,
    concurrency: int = 8,
    timeout: float = 120.0,
    progress: bool = True,
    sessions: str | None = None,
    carry_values: bool = False,
) -> tuple[list[dict], int | None]:
    """The server's observation for every pair (same order), `concurrency` calls at once. Without `sessions`,
    every call is alone: none waits for another (an earlier answer to the same call, cached or in flight, is the
    simulator's own either way: `metrics.answered_from_cache`). With `sessions` (a prefix), each episode is one
    session, `X-Session-Id: <prefix><source>/<episode>`, its calls in step order; with `carry_values` too, a request
    sends the values the simulator's earlier answers gave where the recorded one sent the real answers' values, and
    the observation is the answer with those values named back (`mirrorapi.evaluation.fidelity.carried_values`; the
    served answer is kept as `served`, the values sent as `carried_values`: [real, simulated] pairs).

    Also returns the number of cache entries the server reported before the replay (its `/health`),
    or None when it does not say: a cache that is not empty may answer held-out calls from memory.
    """
    url = virtual_url(server)
    # What must run in order: a session's calls; a call alone waits for nothing (a long episode would otherwise
    # hold a batching engine's other slots idle).
    in_order: dict[tuple, list[int]] = defaultdict(list)  # calls that go one after another, by step
    for index, pair in enumerate(pairs):
        in_order[(pair["source"], pair["episode"]) if sessions is not None else (index,)].append(index)
    results: list[dict | None] = [None] * len(pairs)
    semaphore = asyncio.Semaphore(max(1, concurrency))
    bar = tqdm(total=len(pairs), desc="replaying", unit="call", disable=None if progress else True)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as client:
        try:
            async with client.get(url[: -len("/virtual")] + "/health") as health:  # any HTTP answer will do
                cache_entries = _cache_entries(await health.read())
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise FidelityError(
                f"the virtual server at {server} does not answer ({type(exc).__name__}); start it or fix --server"
            ) from exc
        if cache_entries:
            logger.warning(
                "the server's cache already holds %d entries: calls it has seen are answered from the "
                "cache, not simulated (start it with a fresh cache to measure the simulator)",
                cache_entries,
            )

        async def run_in_order(indices: list[int]) -> None:
            episode = EpisodeValues() if sessions is not None and carry_values else None
            async with semaphore:
                for index in sorted(indices, key=lambda i: pairs[i]["step"]):
                    pair = pairs[index]
                    session = f"{sessions}{pair['source']}/{pair['episode']}" if sessions is not None else None
                    if episode is None:
                        results[index] = await _post(client, url, pair, session)
                    else:
                        results[index] = await _post_carrying(client, url, pair, session, episode)
                    bar.update()

        try:
            await asyncio.gather(*(run_in_order(indices) for indices in in_order.values()))
        finally:
            bar.close()
    return results, cache_entries  # type: ignore[return-value]


async def _post_carrying(
    client: aiohttp.ClientSession, url: str, pair: dict, session: str | None, episode: EpisodeValues
) -> dict:
    tool_input = episode.request(pair["tool_input"])
    carried = episode.carried
    served = await _post(client, url, {**pair, "tool_input": tool_input}, session)
    episode.learn(pair["response"]["response"], served)
    observation = episode.scored(served)
    if carried:
        observation["carried_values"] = carried
    if observation is not served:
        observation["served"] = {"error": served["error"], "response": served["response"]}
    return observation


def _cache_entries(health: bytes) -> int | None:
    try:
        entries = json.loads(health)["cache"]["entries"]
    except (ValueError, KeyError, TypeError):
        return None
    return entries if isinstance(entries, int) else None


def run_fidelity(settings: FidelitySettings, progress: bool = True) -> dict:
    """Replay `settings.pairs` through the server at `settings.server`, score it and the baseline; write the report
    into `settings.out`.

    A call the server answered from what its cache held (`metrics.answered_from_cache`: a recorded answer, e.g. a
    training call with the same arguments) is counted apart and left out of the figures, the baseline's included,
    so that they score the calls the simulator answered: the main figures leave out their pass's hits, the history
    comparison the calls either pass got from the cache; `include_cache_hits` scores them too (a replay server's
    own check).

    `history`: `off` replays each call alone, `on` one session per episode, `both` does both and adds
    the comparison (`mirrorapi.evaluation.fidelity.session_history`; the main figures are then the `off` pass).
    `heldout_episodes`: keep the episodes the SFT builder (`--history heldout_history`) holds out (needs
    `tools`); `max_episodes`: at most N episodes, from each source in turn.
    """
    pairs, server, tools, history = settings.pairs, settings.server, settings.tools, settings.history
    held_out = load_pairs(pairs)
    try:
        registry = ToolRegistry.load(tools) if tools else None
    except RegistryError as exc:
        raise FidelityError(str(exc)) from exc
    if settings.heldout_episodes:
        if registry is None:
            raise FidelityError("--heldout-episodes needs --tools (the split is the SFT builder's)")
        held_out = heldout_episodes(held_out, registry, settings.max_episodes, settings.heldout_history)
    else:
        held_out = some_episodes(held_out, settings.max_episodes)
    if not held_out:
        raise FidelityError("no held-out calls to replay")
    baseline = NearestExample(load_pairs(settings.baseline_pairs), held_out) if settings.baseline_pairs else None
    # loaded before the replay: fail early
    embedder = Embedder(settings.embedding_model) if settings.embedding_model else None
    passes = {}
    cache_entries = None
    session_prefix = f"fidelity-{os.getpid()}-{time.time():.0f}:"  # new sessions on every run
    carry_values = settings.session_values == "carried"
    for name in {"off": ("without",), "on": ("with",), "both": ("without", "with")}[history]:
        sessions = session_prefix if name == "with" else None
        simulated, entries = asyncio.run(
            replay(held_out, server, settings.concurrency, settings.timeout, progress, sessions, carry_values)
        )
        cache_entries = entries if cache_entries is None else cache_entries
        passes[name] = (simulated, compare(held_out, simulated, baseline, registry, embedder))
    # The main figures leave out the calls their own pass got from the cache; the history comparison leaves out those
    # either pass did (`history_report`). Not the same calls: a session request carrying a value the simulator gave
    # (a reservation id it copied from its example) can be a training call's, where the recorded call was not.
    rows = passes["without" if "without" in passes else "with"][1]
    report = build_report(rows, server, baseline is not None, settings.include_cache_hits)
    report.update(cache_entries_at_start=cache_entries, tools=[str(t) for t in tools], history=history)
    if history == "both":
        report["sessions"] = history_report(held_out, passes, settings.include_cache_hits)
    write_report(Path(settings.out), report, rows, passes["with"][1] if history == "both" else None)
    if history == "both":
        with open(Path(settings.out) / "fidelity.md", "a", encoding="utf-8") as fh:
            fh.write(render_history_markdown(report["sessions"]))
    return report
