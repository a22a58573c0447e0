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

import httpx
import openai

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
        self._http = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            timeout=httpx.Timeout(timeout),
        )
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
        kwargs = {"model": self.model, "messages": messages, "temperature": temperature, "max_tokens": max_tokens}
        if response_format is not None:
            kwargs["response_format"] = response_format
        if seed is not None:
            kwargs["seed"] = seed
        if extra_body:
            kwargs["extra_body"] = extra_body
        last: EngineError | None = None
        for attempt in range(self.retries + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            index = next(self._next)
            try:
                completion = await asyncio.wait_for(
                    self._clients[index].chat.completions.create(**kwargs, timeout=remaining), remaining)
                choice = completion.choices[0] if completion.choices else None
                if choice is None or choice.message is None:
                    raise EngineError("empty", "engine answered without a choice")
                return choice.message.content or ""
            except (asyncio.TimeoutError, openai.APITimeoutError):
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
        async def probe(base: str) -> EngineHealth:
            try:
                response = await self._http.get(base + "/models", timeout=timeout)
                return EngineHealth(base, True, f"HTTP {response.status_code}")
            except httpx.HTTPError as exc:
                return EngineHealth(base, False, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
        return list(await asyncio.gather(*(probe(b) for b in self.api_bases)))

    async def aclose(self) -> None:
        await self._http.aclose()
