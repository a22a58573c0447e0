"""EngineClient: the one way mirrorapi talks to a model — OpenAI chat completions over HTTP.

Any OpenAI-compatible server works: `vllm serve` on GPU hosts, `transformers serve` on a CPU.
Several base URLs are replicas; a call goes to the one with the fewest calls in flight (round-robin
among equals). A call has one deadline (`timeout`) for all its attempts, and an attempt that could
move on to another replica its own limit (`attempt_timeout`), so a hung replica costs one attempt,
not the call. The next attempt goes to a replica this call has not tried yet, without waiting; a
replica that failed is skipped by every call for `cooldown` seconds, then probed in the background
(a one-token completion brings it back) before it gets traffic again. Only when no untried healthy replica is left does
a call wait (exponential backoff with full jitter, so retries of many calls do not arrive together).
With `max_in_flight`, a replica takes at most that many calls at once (a CPU engine given many calls
answers none in time); further calls wait for a free one in arrival order, at most `max_waiting` of them:
one more fails at once with EngineError `busy`.

Why aiohttp and not the `openai` SDK: we send one request shape and read one field, and the SDK's
request and response layers cost 1.13 ms of CPU per call against 0.29 ms for a pooled aiohttp
session (64 concurrent calls to a 50 ms stub engine, this machine), more than the virtual server's
whole budget for a cache miss (1 ms, bench/server.py). The tests still check every engine with
the `openai` client, so the protocol we rely on is the SDK's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import math
import random
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import aiohttp

logger = logging.getLogger(__name__)
_ENCODE = json.JSONEncoder(ensure_ascii=False).encode  # json.dumps with arguments builds an encoder per call

# Statuses worth another attempt (elsewhere); any other 4xx means the request itself is wrong, but those of
# REPLICA_STATUS, which say the replica refuses the key or serves another model (vLLM: 401, 404 for a model it does
# not serve): another replica may take the call, and this one is skipped as a failing one is.
NO_API_KEY = "EMPTY"  # the key sent to an engine that needs none (what vLLM and llama.cpp's servers take)
RETRYABLE_STATUS = (408, 429)
REPLICA_STATUS = (401, 403, 404)


def transient_status(status: int | None) -> bool:
    """Whether an engine's HTTP status is one an attempt is made again for (the engine's own failure, busy or
    restarting: 5xx, 408, 429), as against a request it refuses: the retries here and what the server tells its
    clients (`x-mirrorapi-retry`, an OpenEnv step not taken) follow this one rule."""
    return status is not None and (status >= 500 or status in RETRYABLE_STATUS)


def _deadline(seconds: float) -> aiohttp.ClientTimeout:
    """aiohttp's timeout of `seconds`, as set: by default it rounds a timeout of 5 s or more up to the next whole
    second of the loop's clock (`ceil_threshold`), so an engine_timeout of 10 ended 10.2-11.0 s after the call."""
    return aiohttp.ClientTimeout(total=seconds, ceil_threshold=math.inf)


class EngineError(Exception):
    """The engine could not give an answer. `kind`: unreachable (no connection), cut (the connection or the stream
    ended in the middle of the answer), timeout, http, not_json (the HTTP body), no_choice (JSON that is not a chat
    completion), busy (every replica has `max_in_flight` calls and `max_waiting` more wait); the simulator adds
    empty (no text) and garbage (text that is no observation)."""

    def __init__(self, kind: str, message: str, status: int | None = None, retry_after: float | None = None):
        self.kind, self.status = kind, status  # status: the HTTP status of an `http` error
        self.retry_after = retry_after  # seconds the engine's Retry-After asked for (429, 503), if any
        super().__init__(message)


def _retry_after(value: str | None) -> float | None:
    """A Retry-After header's seconds (RFC 9110 §10.2.3: delay-seconds; an HTTP date, which engines do not send,
    is not read)."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


class Completion(NamedTuple):
    """One chat completion: the assistant message as the engine sent it (e.g. with `tool_calls`), the `usage`
    object or {}, and the choice's `finish_reason` ("stop"; "length" when `max_tokens` cut it; None when the engine
    gave none)."""

    message: dict
    usage: dict
    finish_reason: str | None


@dataclass
class EngineHealth:
    base_url: str
    reachable: bool  # answers HTTP at all
    ok: bool  # serves the configured model (lists it, or answers a one-token completion with it)
    detail: str
    cooling_down: float = 0.0  # seconds before calls use this replica again (it failed recently)


@dataclass
class _Replica:
    base: str
    down_until: float = 0.0  # monotonic time; skipped by calls until then
    probing: bool = False  # a background probe is deciding whether it is back
    in_flight: int = 0  # attempts sent and not answered yet
    answered_at: float = 0.0  # monotonic time of its last completion


async def _streamed_completion(response: aiohttp.ClientResponse) -> dict:
    """The chat completion that a stream of `data: {chunk}` events adds up to (content deltas joined). A stream
    that ends with neither `[DONE]` nor a finish reason was cut (an engine that died, a proxy's limit): no
    completion, a `cut` attempt (OpenAI's protocol ends every stream with `data: [DONE]`). An error event's `code`
    is its HTTP status (vLLM's), so that a request the engine refuses mid-stream is not retried."""
    parts: list[str] = []
    finish_reason = None
    done = False
    async for line in response.content:
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            break
        try:
            chunk = json.loads(data)
        except ValueError:
            raise EngineError("not_json", f"engine streamed an event that is not JSON: {data[:200]!r}") from None
        if isinstance(chunk, dict) and chunk.get("error"):
            error = chunk["error"]
            code = error.get("code") if isinstance(error, dict) else None
            status = code if isinstance(code, int) and 400 <= code < 600 else None
            raise EngineError("http", f"engine failed while streaming: {str(error)[:200]}", status=status)
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        delta = choice.get("delta")
        if isinstance(delta, dict) and isinstance(delta.get("content"), str):
            parts.append(delta["content"])
        if choice.get("finish_reason"):
            finish_reason = choice["finish_reason"]
    if not done and finish_reason is None:
        raise EngineError("cut", "engine's stream ended before its answer did (no [DONE], no finish reason)")
    message = {"role": "assistant", "content": "".join(parts)}
    return {"choices": [{"message": message, "finish_reason": finish_reason}]}


class EngineClient:
    """Create it, call `chat`, `await aclose()`. The HTTP session is opened on the first call, inside
    the event loop that uses it.

    `stream=True` asks for the answer as server-sent events (text content only: for judges, not for
    tool calls). Why: `transformers serve` stops generating when the client of a *streamed* request
    goes away, but finishes every non-streamed one, so a CPU engine whose callers time out keeps
    working for nobody (issue 15). vLLM aborts either kind."""

    def __init__(
        self,
        api_bases: list[str] | str,
        model: str,
        api_key: str = NO_API_KEY,
        timeout: float = 60.0,
        retries: int = 2,
        backoff: float = 0.5,
        max_connections: int = 256,
        attempt_timeout: float | None = None,
        cooldown: float = 10.0,
        stream: bool = False,
        max_in_flight: int | None = None,
        max_waiting: int | None = None,
    ):
        bases = [api_bases] if isinstance(api_bases, str) else list(api_bases)
        if not bases:
            raise ValueError("EngineClient needs at least one api_base")
        self.api_bases = [b.rstrip("/") for b in bases]
        self.replicas = [_Replica(b) for b in self.api_bases]
        self.model, self.timeout, self.retries, self.backoff = model, timeout, retries, backoff
        self.attempt_timeout = min(attempt_timeout or timeout, timeout)
        self.cooldown = cooldown
        # The pool must not be a tighter limit than the in-flight one, which it would be silently (calls queued in
        # it spend their attempt's time there): room for every replica's calls, and its probes.
        if max_in_flight is not None:
            max_connections = max(max_connections, (max_in_flight + 1) * len(bases))
        self.max_connections, self.stream = max_connections, stream
        self._headers = {"Authorization": f"Bearer {api_key or NO_API_KEY}", "Content-Type": "application/json"}
        self._session: aiohttp.ClientSession | None = None
        self._turn = 0  # round-robin position
        self._probes: set[asyncio.Task] = set()
        self.max_in_flight, self.max_waiting = max_in_flight, max_waiting
        self._waiters: collections.deque[asyncio.Future] = collections.deque()  # calls waiting for a free replica
        self._handed = 0  # slots handed to woken waiters that have not taken them yet
        self._health_check: asyncio.Future | None = None  # the health check under way, shared by its callers

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:  # one pool for all replicas: connections are reused across requests
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=self.max_connections),
                headers=self._headers,
                timeout=_deadline(self.timeout),
            )
        return self._session

    # ------------------------------------------------------------------------- replica choice
    def _pick(self, tried: set[int]) -> tuple[int, bool]:
        """(replica index, whether it is a fresh one): of the healthy replicas this call has not tried, the
        one with the fewest calls in flight, round-robin among equals (a replica that hangs piles up calls
        in flight, so it gets few new ones even before its first attempt times out); else the one that
        comes back soonest (the caller then backs off first)."""
        now, n = time.monotonic(), len(self.replicas)
        best = None
        for step in range(n):
            index = (self._turn + step) % n
            replica = self.replicas[index]
            if 0 < replica.down_until <= now and not replica.probing:
                self._probe_later(replica)
            if index not in tried and not replica.down_until:  # 0: never failed, or probed back in
                if best is None or replica.in_flight < self.replicas[best].in_flight:
                    best = index
        if best is not None:
            self._turn = best + 1
            return best, True
        index = min(range(n), key=lambda i: (i in tried, self.replicas[i].down_until))
        return index, False

    def _failed(self, index: int, error: EngineError) -> None:
        replica = self.replicas[index]
        if not replica.down_until:
            logger.warning("engine replica %s skipped for %g s: %s", replica.base, self.cooldown, error)
        replica.down_until = time.monotonic() + self.cooldown

    def _probe_later(self, replica: _Replica) -> None:
        """Cool-down over: probe the replica in the background with a one-token completion; it gets calls again
        once it answers one (a replica that lists its models but hangs every completion stays out)."""
        replica.probing = True

        async def probe() -> None:
            try:
                answered, how = await self._answers_one_token(replica.base, min(self.attempt_timeout, 5.0))
                if answered:
                    replica.down_until = 0.0
                    logger.info("engine replica %s is back (%s)", replica.base, how)
                else:
                    replica.down_until = time.monotonic() + self.cooldown
            finally:
                replica.probing = False

        task = asyncio.get_running_loop().create_task(probe())
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    # ------------------------------------------------------------------------------- calls
    async def _post(self, base: str, body: bytes, timeout: float) -> dict:
        async with self._http().post(base + "/chat/completions", data=body, timeout=_deadline(timeout)) as response:
            if response.status < 400 and response.content_type == "text/event-stream":
                return await _streamed_completion(response)
            data = await response.read()
            if response.status >= 400:
                raise EngineError(
                    "http",
                    f"engine answered HTTP {response.status}: {data[:200].decode('utf-8', 'replace')}",
                    status=response.status,
                    retry_after=_retry_after(response.headers.get("Retry-After")),
                )
        return _json_body(data)

    async def chat(
        self,
        messages: list[dict],
        *,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        response_format: dict | None = None,
        seed: int | None = None,
        extra_body: dict | None = None,
    ) -> str:
        """The assistant text for `messages` ("" when the message has none); raises EngineError once
        retries or the deadline run out."""
        message, _, _ = await self.complete(
            messages,
            temperature=temperature,
            max_tokens=max_tokens,
            response_format=response_format,
            seed=seed,
            extra_body=extra_body,
        )
        content = message.get("content")
        return content if isinstance(content, str) else ""

    async def complete(
        self,
        messages: list[dict],
        *,
        temperature: float = 0.0,
        max_tokens: int = 1024,
        response_format: dict | None = None,
        seed: int | None = None,
        extra_body: dict | None = None,
        started: float | None = None,
    ) -> Completion:
        """The completion: the assistant message as the engine sent it, the `usage` object, the finish reason.
        `started` (`time.monotonic()`): when the caller's work that this call is part of began; the deadline,
        `timeout` after it, is then shared with that work's earlier calls (default: now)."""
        deadline = (time.monotonic() if started is None else started) + self.timeout
        body = {"model": self.model, "messages": messages, "temperature": temperature, "max_tokens": max_tokens}
        if response_format is not None:
            body["response_format"] = response_format
        if seed is not None:
            body["seed"] = seed
        if self.stream:
            body["stream"] = True
        body.update(extra_body or {})
        payload = _ENCODE(body).encode()
        last: EngineError | None = None
        tried: set[int] = set()
        for attempt in range(self.retries + 1):
            index, fresh = self._pick(tried)
            # The pause comes before the queue, so that a call handed a slot takes it at once.
            if not fresh and attempt:  # nothing healthy left to try: wait before going again
                if not await self._pause(attempt, last, deadline):
                    break
                index, fresh = self._pick(tried)
            woken = False
            # In arrival order: a call that finds others waiting (or a slot handed to one) queues behind them,
            # though a replica looks free, so that the slot freed for the first waiter is not taken by a later call.
            while self.max_in_flight is not None and (
                self.replicas[index].in_flight >= self.max_in_flight or (not woken and (self._waiters or self._handed))
            ):
                await self._free_replica(deadline)
                woken = True
                index, fresh = self._pick(tried)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if woken:
                    self._wake_one()  # the slot this call was handed goes to the next waiter
                break
            tried.add(index)
            replica = self.replicas[index]
            # The attempt timeout is there to move on to another replica: with none to move on to (the last
            # attempt, or no other healthy replica left) the attempt may take what is left of the deadline,
            # as a slow engine's long answer is better than a retry that starts generating again.
            elsewhere = attempt < self.retries and any(
                i not in tried and not r.down_until for i, r in enumerate(self.replicas)
            )
            base, limit = replica.base, min(self.attempt_timeout, remaining) if elsewhere else remaining
            replica.in_flight += 1
            try:  # aiohttp's total timeout bounds the attempt (asyncio.wait_for would cost a task per attempt)
                answer = _message(await self._post(base, payload, limit))
                replica.down_until = 0.0  # it answered (a call with nothing better to try may use a cooling one)
                replica.answered_at = time.monotonic()
                return answer
            except asyncio.TimeoutError:
                last = EngineError("timeout", f"engine at {base} did not answer within {limit:g} s")
            except aiohttp.ClientError as exc:
                last = _connection_failure(base, exc)
            except EngineError as exc:
                last = exc
                if exc.status and not transient_status(exc.status) and exc.status not in REPLICA_STATUS:
                    break  # the request itself is wrong: retrying will not help
            finally:
                replica.in_flight -= 1
                self._wake_one()
            self._failed(index, last)
            logger.warning("engine attempt %d/%d failed: %s", attempt + 1, self.retries + 1, last)
            if last.status in REPLICA_STATUS and not elsewhere:
                break  # no other replica to ask, and this one will answer the same again
        raise last or EngineError("timeout", f"engine did not answer within {self.timeout:g} s")

    async def _pause(self, attempt: int, last: EngineError | None, deadline: float) -> bool:
        """The wait before another attempt on a replica that failed: full jitter, or as long as the engine's
        Retry-After asked (RFC 9110); False, at once, when that is longer than the call has left (it would fail at its
        deadline, its client kept waiting for nothing)."""
        pause = random.uniform(0, self.backoff * (2 ** (attempt - 1)))
        if last is not None and last.retry_after is not None:
            if last.retry_after >= deadline - time.monotonic():
                return False
            pause = last.retry_after
        await asyncio.sleep(max(0.0, min(pause, deadline - time.monotonic())))
        return True

    async def _free_replica(self, deadline: float) -> None:
        """Wait, in arrival order, until an attempt somewhere ends; EngineError `busy` when `max_waiting` calls
        already wait, `timeout` when the call's deadline comes first."""
        if self.max_waiting is not None and len(self._waiters) >= self.max_waiting:
            raise EngineError(
                "busy",
                f"the simulator engine is busy: {self.max_in_flight} calls in flight on each of "
                f"{len(self.replicas)} replica(s) and {len(self._waiters)} waiting",
            )
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        taken = False
        try:
            await asyncio.wait_for(waiter, max(0.0, deadline - time.monotonic()))
            taken = True
        except asyncio.TimeoutError:
            raise EngineError("timeout", f"no engine replica was free within {self.timeout:g} s") from None
        finally:
            if waiter.done() and not waiter.cancelled():  # a slot was handed to this call
                self._handed -= 1
                if not taken:  # the call is gone (cancelled as it was woken): the slot goes to the next waiter
                    self._wake_one()
            else:
                waiter.cancel()
            with contextlib.suppress(ValueError):
                self._waiters.remove(waiter)

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._handed += 1
                return

    # ------------------------------------------------------------------------------ health
    async def _reachable(self, base: str, timeout: float, busy: bool = False) -> EngineHealth:
        """GET /models: whether the replica answers HTTP, and the model ids it lists (in `detail`). `busy`: it is
        answering calls of ours or answered one lately, so a GET /models that only times out means busy, not down
        (llama.cpp's server answers it only between completions: a long one keeps it waiting)."""
        try:
            async with self._http().get(base + "/models", timeout=_deadline(timeout)) as r:
                data = await r.read()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            if busy and isinstance(exc, asyncio.TimeoutError):  # aiohttp's timeouts are asyncio's
                return EngineHealth(
                    base,
                    True,
                    True,
                    f"busy: GET /models not answered within {timeout:g} s while it answers calls (an engine that "
                    "lists its models only between completions, as llama.cpp's)",
                )
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            return EngineHealth(base, False, False, detail)
        ids = _model_ids(data) if r.status == 200 else None
        if ids is not None and self.model in ids:
            return EngineHealth(base, True, True, f"serves {self.model!r}")
        listed = f"lists {', '.join(ids[:5]) or 'no model'}" if ids is not None else f"GET /models: HTTP {r.status}"
        return EngineHealth(base, True, False, listed)

    async def _answers_one_token(self, base: str, timeout: float) -> tuple[bool, str]:
        body = json.dumps(
            {"model": self.model, "max_tokens": 1, "temperature": 0, "messages": [{"role": "user", "content": "ping"}]}
        ).encode()
        try:
            _message(await asyncio.wait_for(self._post(base, body, timeout), timeout))
            return True, "answered a one-token completion"
        except asyncio.TimeoutError:
            return False, f"no one-token completion within {timeout:g} s"
        except (aiohttp.ClientError, EngineError) as exc:
            return False, f"one-token completion failed: {str(exc)[:200]}"

    async def health(self, timeout: float = 3.0) -> list[EngineHealth]:
        """Per replica: `ok` only if it lists the configured model, or (an engine whose /models does not
        list it, such as `transformers serve`) answers a one-token completion for it (or answered a call of ours
        lately: then it is not asked again, as a health poller would otherwise add a completion to the calls the
        in-flight limit holds it to), and calls are not skipping it (it failed one lately and has not answered a
        probe's completion since).

        Calls made while a check is under way get its answer: the server's /health is open to every caller, and
        each check may ask the engine for a completion, outside the in-flight limit (twenty callers at once once
        sent twenty)."""
        if self._health_check is None or self._health_check.done():
            self._health_check = asyncio.ensure_future(self._health(timeout))
        return list(await asyncio.shield(self._health_check))

    async def _health(self, timeout: float) -> list[EngineHealth]:
        async def check(replica: _Replica) -> EngineHealth:
            if 0 < replica.down_until <= time.monotonic() and not replica.probing:
                # Cool-down over, and no call has come to probe it (`_pick` does, on a call): a readiness check
                # that holds traffic back until /health is 200 would otherwise wait for ever.
                answered, how = await self._answers_one_token(replica.base, timeout)
                if answered:
                    replica.down_until, replica.answered_at = 0.0, time.monotonic()
                    logger.info("engine replica %s is back (%s)", replica.base, how)
                else:
                    replica.down_until = time.monotonic() + self.cooldown
            busy = bool(replica.in_flight) or time.monotonic() - replica.answered_at < self.timeout
            health = await self._reachable(replica.base, timeout, busy and not replica.down_until)
            since = time.monotonic() - replica.answered_at
            if health.reachable and not health.ok and since < self.timeout:
                health.ok, health.detail = True, f"answered a completion for it {since:.0f} s ago"
            elif health.reachable and not health.ok:
                answered, how = await self._answers_one_token(replica.base, timeout)
                if answered:  # as a call's answer: the next checks take it (`since` above), not ask again
                    replica.answered_at = time.monotonic()
                health.ok = answered
                health.detail = how if answered else f"does not serve model {self.model!r} ({health.detail}; {how})"
            health.cooling_down = round(max(0.0, replica.down_until - time.monotonic()), 1)
            if replica.down_until and health.ok:
                health.ok = False
                health.detail = f"{health.detail}, but its calls failed lately: skipped until it answers a completion"
            return health

        return list(await asyncio.gather(*(check(r) for r in self.replicas)))

    async def served_by(self, timeout: float = 3.0) -> str | None:
        """Which engine serves the model: the `owned_by` of its entry in the first replica's `GET /models`
        (`vllm` for vLLM); None when the list does not name the model or cannot be read."""
        try:
            async with self._http().get(self.api_bases[0] + "/models", timeout=_deadline(timeout)) as response:
                data = await response.read()
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None
        entries = _model_entries(data) if response.status == 200 else None
        owner = next((e.get("owned_by") for e in entries or [] if e.get("id") == self.model), None)
        return owner if isinstance(owner, str) else None

    async def aclose(self) -> None:
        for task in list(self._probes):
            task.cancel()
        if self._session is not None:
            await self._session.close()


def _connection_failure(base: str, exc: aiohttp.ClientError) -> EngineError:
    """`unreachable` when no connection was made (refused, no route, DNS), `cut` when one was, then reset or closed
    in the middle of the answer: a judge run stops on the first, not on one answer broken off."""
    what = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return EngineError("unreachable", f"engine at {base} is unreachable ({what})")
    return EngineError("cut", f"engine at {base} broke off its answer ({what})")


def _json_body(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        raise EngineError("not_json", f"engine answered with a body that is not JSON: {data[:200]!r}") from None


def _message(completion: object) -> Completion:
    """The `Completion` of a chat completion's JSON; EngineError `no_choice` for JSON of another shape."""
    choices = completion.get("choices") if isinstance(completion, dict) else None
    message = (
        choices[0].get("message") if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    )
    if not isinstance(message, dict):
        raise EngineError(
            "no_choice",
            f"engine answered JSON that is not a chat completion: {json.dumps(completion, ensure_ascii=False)[:200]}",
        )
    usage = completion.get("usage")  # type: ignore[attr-defined]  # a dict: `message` was found in it
    finish_reason = choices[0].get("finish_reason")  # type: ignore[index]  # a list: `message` was found in it
    return Completion(
        message, usage if isinstance(usage, dict) else {}, finish_reason if isinstance(finish_reason, str) else None
    )


def _model_entries(data: bytes) -> list[dict] | None:
    """The entries of an OpenAI `GET /models` answer (`{"data": [{"id": ..., "owned_by": ...}]}`), or None for
    another shape."""
    try:
        listing = json.loads(data)
    except ValueError:
        return None
    entries = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(entries, list):
        return None
    return [e for e in entries if isinstance(e, dict)]


def _model_ids(data: bytes) -> list[str] | None:
    """Model ids of an OpenAI `GET /models` answer, or None for another shape."""
    entries = _model_entries(data)
    return None if entries is None else [str(e["id"]) for e in entries if "id" in e]


# Requests in flight by engine (the `owned_by` of its /v1/models), for judges and agents; others get
# DEFAULT_CONCURRENCY.
ENGINE_CONCURRENCY = {"vllm": 16}
DEFAULT_CONCURRENCY = 2


async def engine_concurrency(engine: EngineClient) -> int:
    """Requests in flight (a judge's calls, an agent's queries) when `--concurrency` is not given: what the
    engine can work on at once.

    vLLM batches requests, so 16 keep it busy. `transformers serve` generates one request at a time
    on one thread and does not drop a request whose client gave up (non-streaming): 16 in flight on a
    CPU queue up past the client's timeout, and the engine keeps generating the abandoned ones
    (issue 15: 70 of 76 calls timed out, the next run found the engine still busy). Any engine not
    known to batch gets 2: one generating, one queued behind it.
    """
    return ENGINE_CONCURRENCY.get(await engine.served_by() or "", DEFAULT_CONCURRENCY)
