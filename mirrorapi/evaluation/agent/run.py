"""A whole agent run: every query not finished yet, run concurrently, then the converted files rebuilt.

A query fails, is reported on one line and is left unwritten (a rerun retries it) when the agent
engine or the virtual server cannot be reached or times out. A model error that retrying cannot fix
(HTTP 400 / 413, e.g. a prompt longer than the model's context) ends the chain like an error message
does upstream: the answer is written, without a final answer.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from mirrorapi.engine_client import EngineClient, engine_concurrency
from mirrorapi.evaluation.agent.environment import (
    QueryError,
    VirtualClient,
    query_tools,
)
from mirrorapi.evaluation.agent.files import (
    ANSWER_DIR,
    check_same_agent,
    finished_answer,
    load_queries,
    raw_answer_path,
    write_atomically,
)
from mirrorapi.evaluation.agent.search import QueryFailed, run_query
from mirrorapi.evaluation.agent.settings import AgentRunError, AgentSettings, check_method
from mirrorapi.evaluation.answers.convert import convert_answer_folder
from mirrorapi.tools import RegistryError, ToolRegistry

logger = logging.getLogger(__name__)


@dataclass
class AgentRun:
    done: int  # queries finished in this run
    skipped: int  # finished before (resume)
    failures: list[str]  # one line per query not finished
    converted: dict[str, Path | dict]  # group -> converted file (convert_answer_folder's answer)
    seconds: float = 0.0

    @property
    def complete(self) -> bool:
        return not self.failures


def load_registry(tools: list[str | os.PathLike], query_files: list[Path]) -> ToolRegistry:
    """The tools folder(s) first, then the query files (their api_list fills missing docs)."""
    try:
        registry = ToolRegistry.load(tools)
    except RegistryError as exc:
        raise AgentRunError(str(exc)) from None
    for file in query_files:
        registry.add_query_file(file)
    return registry


async def check_services(engine: EngineClient, server: VirtualClient) -> None:
    health = await engine.health()
    if not any(h.reachable for h in health):
        raise AgentRunError(
            "the agent engine is not reachable ("
            + "; ".join(f"{h.base_url}: {h.detail}" for h in health)
            + "); start it or fix --base-url"
        )
    problem = await server.probe()
    if problem:
        raise AgentRunError(f"{problem}; start it or fix --server")


async def run_agent_async(
    queries: str | os.PathLike,
    settings: AgentSettings,
    out: str | os.PathLike,
    tools: Sequence[str | os.PathLike] = (),
    progress: bool = True,
    limit: int | None = None,
) -> AgentRun:
    """Run every query of `queries` not finished in `out` yet; write raw + converted answers."""
    start = time.monotonic()
    check_method(settings.method)
    out = Path(out)
    groups = load_queries(queries)
    query_path = Path(queries)
    files = sorted(p for p in query_path.iterdir() if p.suffix == ".json") if query_path.is_dir() else [query_path]
    registry = load_registry(list(tools), files)
    system_prompt = (
        Path(settings.system_prompt_file).read_text(encoding="utf-8") if settings.system_prompt_file else None
    )
    todo, skipped = [], 0
    for group in groups:  # the converted <group>.json is rebuilt from one method's raw answers: never mix two
        for path in sorted((out / ANSWER_DIR / group).glob("*.json")):
            other = finished_answer(path) if not path.name.endswith(f"_{settings.method}.json") else None
            if other is not None:
                check_same_agent(other, settings, path)
    for group, items in groups.items():
        for item in items[:limit] if limit else items:
            qid = str(item.get("query_id"))
            path = raw_answer_path(out, group, qid, settings.method)
            finished = finished_answer(path)
            if finished is not None:
                check_same_agent(finished, settings, path)
                skipped += 1
            else:
                todo.append((group, qid, item))
    failures: list[str] = []
    done = 0
    if todo:
        engine = EngineClient(settings.base_urls, settings.model, api_key=settings.api_key, timeout=settings.timeout)
        server = VirtualClient(settings.server, timeout=settings.server_timeout)
        try:
            await check_services(engine, server)
            if settings.concurrency is None:
                settings = replace(settings, concurrency=await engine_concurrency(engine))
                logger.info(
                    "agent engine %s: %d queries in flight (--concurrency sets another number)",
                    settings.base_urls[0],
                    settings.concurrency,
                )
            done = await _run_all(todo, registry, engine, server, settings, system_prompt, out, failures, progress)
        finally:
            await engine.aclose()
            await server.aclose()
    converted = {
        group: convert_answer_folder(out / ANSWER_DIR / group, settings.method, out / f"{group}.json")
        for group in groups
        if (out / ANSWER_DIR / group).is_dir()
    }
    return AgentRun(done, skipped, failures, converted, time.monotonic() - start)


async def _run_all(todo, registry, engine, server, settings, system_prompt, out, failures, progress) -> int:
    semaphore = asyncio.Semaphore(max(1, settings.concurrency))
    down = asyncio.Event()  # engine or server unreachable: the rest are not started
    bar = tqdm(
        total=len(todo), desc=f"{settings.model} {settings.method}", unit="query", disable=None if progress else True
    )
    done = 0

    async def one(group: str, qid: str, item: dict) -> None:
        nonlocal done
        async with semaphore:
            try:
                if down.is_set():
                    raise QueryFailed("not started: the agent engine or the virtual server is down")
                try:
                    tools = query_tools(item, registry)
                except QueryError as exc:
                    raise QueryFailed(str(exc)) from None
                data = await run_query(item, tools, engine, server, settings, system_prompt)
                write_atomically(raw_answer_path(out, group, qid, settings.method), data)
                done += 1
            except QueryFailed as exc:
                line = f"query {group}/{qid} failed: {exc}"
                failures.append(line)
                bar.write(line)
                if "unreachable" in str(exc):
                    down.set()
            finally:
                bar.update()

    try:
        await asyncio.gather(*(one(*task) for task in todo))
    finally:
        bar.close()
    return done


def run_agent(
    queries, settings: AgentSettings, out, tools=(), progress: bool = True, limit: int | None = None
) -> AgentRun:
    return asyncio.run(run_agent_async(queries, settings, out, tools, progress, limit))
