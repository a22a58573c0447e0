"""EngineClient: the one way mirrorapi talks to a model — OpenAI chat completions over HTTP.

Any OpenAI-compatible server works: `vllm serve` on GPU hosts, `transformers serve` on a CPU.
Several base URLs (replicas) are used round-robin; a failed attempt moves to the next replica.
Every call has one deadline (`timeout`) that covers all its retries, so a slow or dead engine costs
a caller at most `timeout` seconds, never more.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass

import openai

try:
    import httpx2 as _httpx  # what openai >= 3 is built on
except ImportError:  # older openai: httpx
    import httpx as _httpx

logger = logging.getLogger(__name__)


class EngineError(Exception):
    """The engine could not give an answer. `kind`: unreachable, timeout, http, empty."""

    def __init__(self, kind: str, message: str):
        self.kind = kind
        super().__init__(message)


@dataclass
class EngineHealth:
    base_url: str
    reachable: bool
    detail: str


class EngineClient:
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
        # One pooled HTTP client shared by all replicas: connections are reused across requests.
        self._http = _sdk_http_client(max_connections, timeout)
        self._clients = [
            openai.AsyncOpenAI(base_url=b, api_key=api_key or "EMPTY", max_retries=0, http_client=self._http)
            for b in self.api_bases
        ]
        self._next = itertools.cycle(range(len(self._clients)))

    async def chat(self, messages: list[dict], *, temperature: float = 0.0, max_tokens: int = 1024,
                   response_format: dict | None = None, seed: int | None = None,
                   extra_body: dict | None = None) -> str:
        """The assistant text for `messages`; raises EngineError once retries or the deadline run out."""
        deadline = time.monotonic() + self.timeout
        body = {"model": self.model, "messages": messages, "temperature": temperature, "max_tokens": max_tokens}
        if response_format is not None:
            body["response_format"] = response_format
        if seed is not None:
            body["seed"] = seed
        body.update(extra_body or {})
        last: EngineError | None = None
        for attempt in range(self.retries + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            index = next(self._next)
            try:
                # The SDK's `post` for the chat endpoint, not the typed `chat.completions.create`: the
                # typed call spends about 1 ms of CPU per call transforming parameters and building
                # response models (bench/server.py); `post` keeps the SDK's connections, timeouts and errors.
                completion = await asyncio.wait_for(self._clients[index].post(
                    "/chat/completions", cast_to=object, body=body, options={"timeout": remaining}), remaining)
                choices = completion.get("choices") if isinstance(completion, dict) else None
                message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
                if not isinstance(message, dict):
                    raise EngineError("empty", "engine answered without a choice")
                return message.get("content") or ""
            except (asyncio.TimeoutError, openai.APITimeoutError):
                if deadline - time.monotonic() > 0.1:
                    # Failed long before its deadline: the aiohttp transport reports a refused connection
                    # as a connect timeout.
                    last = EngineError("unreachable", f"engine at {self.api_bases[index]} is unreachable")
                else:
                    last = EngineError("timeout", f"engine did not answer within {self.timeout:g} s")
            except openai.APIConnectionError as exc:
                last = EngineError("unreachable", f"engine at {self.api_bases[index]} is unreachable ({exc})")
            except openai.APIStatusError as exc:
                last = EngineError("http", f"engine answered HTTP {exc.status_code}: {str(exc)[:200]}")
                if exc.status_code < 500 and exc.status_code not in (408, 429):
                    break  # the request itself is wrong: retrying will not help
            except EngineError as exc:
                last = exc
            logger.warning("engine attempt %d/%d failed: %s", attempt + 1, self.retries + 1, last)
            pause = min(self.backoff * (2 ** attempt), deadline - time.monotonic())
            if attempt < self.retries and pause > 0:
                await asyncio.sleep(pause)
        raise last or EngineError("timeout", f"engine did not answer within {self.timeout:g} s")

    async def health(self, timeout: float = 3.0) -> list[EngineHealth]:
        """Whether each replica answers HTTP at all (any status counts: `transformers serve` may 500 on /models)."""
        async def probe(client: openai.AsyncOpenAI, base: str) -> EngineHealth:
            try:
                await asyncio.wait_for(client.get("/models", cast_to=object, options={"timeout": timeout}), timeout)
                return EngineHealth(base, True, "HTTP 200")
            except openai.APIStatusError as exc:
                return EngineHealth(base, True, f"HTTP {exc.status_code}")
            except (openai.APIConnectionError, asyncio.TimeoutError) as exc:
                cause = exc.__cause__ or exc  # the transport's own error says more (refused, reset, ...)
                detail = f"{type(cause).__name__}: {cause}" if str(cause) else type(cause).__name__
                return EngineHealth(base, False, detail)
        return list(await asyncio.gather(*(probe(c, b) for c, b in zip(self._clients, self.api_bases))))

    async def aclose(self) -> None:
        await self._http.aclose()


def _sdk_http_client(max_connections: int, timeout: float):
    """The openai SDK's own async HTTP client with our pool size: its aiohttp transport when aiohttp
    is installed (about 1 ms less CPU per call than httpx at 64 concurrent calls, bench/server.py),
    otherwise its default httpx one."""
    limits = _httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
    try:
        return openai.DefaultAioHttpClient(limits=limits, timeout=timeout)
    except (AttributeError, RuntimeError):  # an SDK without it, or aiohttp not installed
        return openai.DefaultAsyncHttpxClient(limits=limits, timeout=timeout)
