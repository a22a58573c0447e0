"""EngineClient: the one way mirrorapi talks to a model — OpenAI chat completions over HTTP.

Any OpenAI-compatible server works: `vllm serve` on GPU hosts, `transformers serve` on a CPU.
Several base URLs (replicas) are used round-robin; a failed attempt moves to the next replica.
Every call has one deadline (`timeout`) that covers all its retries, so a slow or dead engine costs
a caller at most `timeout` seconds, never more.

Why aiohttp and not the `openai` SDK: we send one request shape and read one field, and the SDK's
request and response layers cost 1.13 ms of CPU per call against 0.29 ms for a pooled aiohttp
session (64 concurrent calls to a 50 ms stub engine, this machine), more than the virtual server's
whole budget for a cache miss (1 ms, bench/server.py). The tests still check every engine with
the `openai` client, so the protocol we rely on is the SDK's.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from dataclasses import dataclass

import aiohttp

logger = logging.getLogger(__name__)


class EngineError(Exception):
    """The engine could not give an answer. `kind`: unreachable, timeout, http, empty."""

    def __init__(self, kind: str, message: str, status: int | None = None):
        self.kind, self.status = kind, status  # status: the HTTP status of an `http` error
        super().__init__(message)


@dataclass
class EngineHealth:
    base_url: str
    reachable: bool
    detail: str


class EngineClient:
    """Create it, call `chat`, `await aclose()`. The HTTP session is opened on the first call, inside
    the event loop that uses it."""

    def __init__(
        self,
        api_bases: list[str] | str,
        model: str,
        api_key: str = "EMPTY",
        timeout: float = 60.0,
        retries: int = 2,
        backoff: float = 0.5,
        max_connections: int = 256,
    ):
        bases = [api_bases] if isinstance(api_bases, str) else list(api_bases)
        if not bases:
            raise ValueError("EngineClient needs at least one api_base")
        self.api_bases = [b.rstrip("/") for b in bases]
        self.model, self.timeout, self.retries, self.backoff = model, timeout, retries, backoff
        self.max_connections = max_connections
        self._headers = {"Authorization": f"Bearer {api_key or 'EMPTY'}", "Content-Type": "application/json"}
        self._session: aiohttp.ClientSession | None = None
        self._next = itertools.cycle(range(len(self.api_bases)))

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:  # one pool for all replicas: connections are reused across requests
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=self.max_connections),
                headers=self._headers, timeout=aiohttp.ClientTimeout(total=self.timeout))
        return self._session

    async def _post(self, base: str, body: bytes, timeout: float) -> dict:
        async with self._http().post(base + "/chat/completions", data=body,
                                     timeout=aiohttp.ClientTimeout(total=timeout)) as response:
            data = await response.read()
            if response.status >= 400:
                raise EngineError("http", f"engine answered HTTP {response.status}: "
                                          f"{data[:200].decode('utf-8', 'replace')}", status=response.status)
        try:
            return json.loads(data)
        except ValueError:
            raise EngineError("empty", f"engine answered with a body that is not JSON: {data[:200]!r}") from None

    async def chat(self, messages: list[dict], *, temperature: float = 0.0, max_tokens: int = 1024,
                   response_format: dict | None = None, seed: int | None = None,
                   extra_body: dict | None = None) -> str:
        """The assistant text for `messages`; raises EngineError once retries or the deadline run out."""
        message, _ = await self.complete(messages, temperature=temperature, max_tokens=max_tokens,
                                         response_format=response_format, seed=seed, extra_body=extra_body)
        content = message.get("content")
        return content if isinstance(content, str) else ""

    async def complete(self, messages: list[dict], *, temperature: float = 0.0, max_tokens: int = 1024,
                       response_format: dict | None = None, seed: int | None = None,
                       extra_body: dict | None = None) -> tuple[dict, dict]:
        """(the assistant message as the engine sent it, e.g. with `tool_calls`; the `usage` object or {})."""
        deadline = time.monotonic() + self.timeout
        body = {"model": self.model, "messages": messages, "temperature": temperature, "max_tokens": max_tokens}
        if response_format is not None:
            body["response_format"] = response_format
        if seed is not None:
            body["seed"] = seed
        body.update(extra_body or {})
        payload = json.dumps(body, ensure_ascii=False).encode()
        last: EngineError | None = None
        for attempt in range(self.retries + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            base = self.api_bases[next(self._next)]
            try:
                completion = await asyncio.wait_for(self._post(base, payload, remaining), remaining)
                choices = completion.get("choices") if isinstance(completion, dict) else None
                message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
                if not isinstance(message, dict):
                    raise EngineError("empty", "engine answered without a choice")
                usage = completion.get("usage")
                return message, usage if isinstance(usage, dict) else {}
            except asyncio.TimeoutError:
                last = EngineError("timeout", f"engine did not answer within {self.timeout:g} s")
            except aiohttp.ClientError as exc:  # refused, reset, closed mid-answer
                last = EngineError("unreachable", f"engine at {base} is unreachable ({type(exc).__name__}: {exc})")
            except EngineError as exc:
                last = exc
                if exc.status and exc.status < 500 and exc.status not in (408, 429):
                    break  # the request itself is wrong: retrying will not help
            logger.warning("engine attempt %d/%d failed: %s", attempt + 1, self.retries + 1, last)
            pause = min(self.backoff * (2 ** attempt), deadline - time.monotonic())
            if attempt < self.retries and pause > 0:
                await asyncio.sleep(pause)
        raise last or EngineError("timeout", f"engine did not answer within {self.timeout:g} s")

    async def health(self, timeout: float = 3.0) -> list[EngineHealth]:
        """Whether each replica answers HTTP at all (any status counts: `transformers serve` may 500 on /models)."""
        async def probe(base: str) -> EngineHealth:
            try:
                async with self._http().get(base + "/models", timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                    return EngineHealth(base, True, f"HTTP {r.status}")
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                return EngineHealth(base, False, detail)
        return list(await asyncio.gather(*(probe(b) for b in self.api_bases)))

    async def served_by(self, timeout: float = 3.0) -> str | None:
        """Which engine serves the model: the `owned_by` of its entry in the first replica's `GET /models`
        (`vllm` for vLLM); None when the list does not name the model or cannot be read."""
        try:
            async with self._http().get(self.api_bases[0] + "/models",
                                        timeout=aiohttp.ClientTimeout(total=timeout)) as response:
                listing = await response.json(content_type=None) if response.status == 200 else {}
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None
        models = listing.get("data") if isinstance(listing, dict) else None
        for model in models if isinstance(models, list) else []:
            if isinstance(model, dict) and model.get("id") == self.model:
                owner = model.get("owned_by")
                return owner if isinstance(owner, str) else None
        return None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
