"""llama.cpp's OpenAI-compatible server (`llama-cpp-python[server]`), answering the OpenAI requests we send.

    python -m mirrorapi.llama_cpp_engine --model FILE.gguf --model_alias NAME --port N [...]

Every flag is llama-cpp-python's own (`python -m llama_cpp.server --help`); the server is its `create_app`, run by
uvicorn. Our defaults (SERVER_DEFAULTS; a flag given wins):
- `--host 127.0.0.1`;
- `--n_ctx 8192`: SmolLM2's trained context (its KV cache is ~190 MB); simulator prompts with long docs fit;
- `--n_threads`/`--n_threads_batch`: the cores this process may use;
- `--interrupt_requests false`: the server runs one request at a time, and by default a new request cuts the
  streamed answer in progress short (bench/engines.py saw it: 4 clients, no answer finished);
- `--logits_all false`: logits of the last position only (the others serve only the prompt's `logprobs`);
- `--verbose false`: no per-request timing lines from llama.cpp on stderr.
Two differences from OpenAI's API matter to the virtual server and the judges, so each chat or text
completion request is rewritten before llama-cpp-python reads it:
- `response_format: {"type": "json_schema", "json_schema": {"schema": S}}` (what the virtual server sends) is
  refused there (HTTP 500: its request type knows "text" and "json_object" only), while its own dialect
  `{"type": "json_object", "schema": S}` is enforced with a grammar compiled from S. Rewritten to that dialect.
- its grammar compiler reads an empty sub-schema (`{}`: any JSON value, as our observation's `response`; also in
  `anyOf` branches) as
  "an object", so a fine-tuned simulator asked for `"success"` can only write `{}`; empty sub-schemas are
  rewritten to the explicit union of JSON types, which it compiles as meant.
- `repeat_penalty` defaults to 1.1 there; OpenAI's API has no such penalty, and with it greedy answers differ
  from every other engine's (JSON repeats its keys and quotes). Set to 1.0 unless the request gives one.
Not a new engine and no new endpoint: an ASGI wrapper of about forty lines around llama-cpp-python's app, and one
change to how it samples (GrammarCheckedGreedy): a greedy answer under a grammar (every `response_format` the
virtual server sends) checks the likeliest token against the grammar before applying the grammar to the whole
vocabulary, as llama.cpp's own sampler does: the same tokens, each written in about half the time.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import logging
import os
import sys
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

REWRITTEN_PATHS = ("/v1/chat/completions", "/v1/completions")
ANY_JSON = {"type": ["string", "number", "boolean", "object", "array", "null"]}
SERVER_DEFAULTS = {
    "host": "127.0.0.1",
    "n_ctx": 8192,
    "interrupt_requests": False,
    "logits_all": False,
    "verbose": False,
}


# Keys that describe a value without constraining it: a sub-schema of these alone (or none) allows any JSON value.
ANNOTATIONS = frozenset(
    ("description", "title", "format", "default", "examples", "example", "nullable", "$comment", "deprecated")
    + ("readOnly", "writeOnly")
)


def explicit_any(schema):
    """`schema` with every sub-schema under `properties`, `$defs`, `definitions`, `items`, `additionalProperties`,
    `anyOf`, `oneOf`, `allOf` or `prefixItems` that allows any value (empty, or annotations alone: `{"description":
    "The teams", "format": "jsonb"}`) made ANY_JSON. Why: llama-cpp-python's schema converter refuses such a
    sub-schema ("Unrecognized schema") and then, without a word, enforces its grammar for any JSON value instead of
    the whole schema (841 of ToolEnv2404's APIs, 2026-11-30; 19 more under `allOf`)."""

    def rewritten(sub):
        return ANY_JSON if isinstance(sub, dict) and sub.keys() <= ANNOTATIONS else explicit_any(sub)

    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in ("properties", "$defs", "definitions"):
        if isinstance(out.get(key), dict):
            out[key] = {k: rewritten(v) for k, v in out[key].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = rewritten(out[key])
    for key in ("items", "anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(out.get(key), list):
            out[key] = [rewritten(v) for v in out[key]]
    return out


@functools.lru_cache(maxsize=1024)
def enforceable(schema_text: str) -> dict:
    """The schema (JSON text: a cache key) the engine is given: `explicit_any` of it, or, where llama-cpp-python's
    converter still refuses it (a `pattern` not written `^...$`, a recursive `$ref`: 64 of ToolEnv2404's APIs), the
    observation with every `response` any JSON value, so that the `{"error", "response"}` envelope stays enforced
    where the converter would silently enforce nothing but "some JSON"."""
    schema = explicit_any(json.loads(schema_text))
    try:
        from llama_cpp.llama_grammar import json_schema_to_gbnf
    except ImportError:  # not the engine's process (tests, tools): nothing to check against
        return schema

    def compiles(candidate: dict) -> bool:
        try:
            json_schema_to_gbnf(json.dumps(candidate))
            return True
        except Exception:  # the converter raises plain Exceptions, AssertionErrors, RecursionErrors
            return False

    if compiles(schema):
        return schema
    envelope = _any_response(schema)
    if envelope is schema or not compiles(envelope):
        return schema  # not an observation, or not even its envelope compiles: the engine's own fallback
    logger.warning("a response schema llama.cpp cannot compile: only the observation's envelope is enforced")
    return envelope


def _any_response(schema: dict) -> dict:
    """The observation schema (alone, or the `anyOf` of its branches) with each branch's `response` any JSON value;
    `schema` itself when it has none."""

    def loosened(branch):
        properties = branch.get("properties") if isinstance(branch, dict) else None
        if not isinstance(properties, dict) or "response" not in properties:
            return branch
        return {**branch, "properties": {**properties, "response": ANY_JSON}}

    if isinstance(schema.get("anyOf"), list):
        branches = [loosened(b) for b in schema["anyOf"]]
        return schema if branches == schema["anyOf"] else {**schema, "anyOf": branches}
    found = loosened(schema)
    return schema if found is schema else found


def openai_request(body: bytes) -> bytes:
    """The request body in llama-cpp-python's dialect; a body that is not a JSON object is left as it is (for
    `request_problem` to refuse)."""
    try:
        request = json.loads(body)
    except ValueError:
        return body
    if not isinstance(request, dict):
        return body
    response_format = request.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "json_schema":
        json_schema = response_format.get("json_schema")
        if not isinstance(json_schema, dict):  # not OpenAI's shape: `request_problem` refuses it
            return body
        schema = json_schema.get("schema")
        enforced = enforceable(json.dumps(schema)) if schema else None  # keys in order: the grammar's order
        request["response_format"] = {"type": "json_object", **({"schema": enforced} if enforced else {})}
    request.setdefault("repeat_penalty", 1.0)
    return json.dumps(request).encode()


class OpenAIDialect:
    """ASGI middleware: buffers the body of a completion request, rewrites it (`openai_request`) and hands it on
    with its new length; any other request passes untouched."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in REWRITTEN_PATHS:
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending its body
                return None
            body += message.get("body", b"")
            more = message.get("more_body", False)
        body = openai_request(body)
        if (problem := request_problem(scope["path"], body)) is not None:
            return await _send_json(send, 400, {"error": {"message": problem, "type": "invalid_request_error"}})
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
        scope = dict(scope, headers=[*headers, (b"content-length", str(len(body)).encode())])
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()  # later messages: a disconnect while an answer streams
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


def request_problem(path: str, body: bytes) -> str | None:
    """Why llama-cpp-python cannot read a completion request, or None: its error handler answers a request its own
    types refuse with HTTP 500 (an unhandled exception, for a body that is no JSON), where OpenAI's API answers 400
    `invalid_request_error`, and a client retries a 500 (our engine client three times, then skips the engine)."""
    from llama_cpp.server.types import CreateChatCompletionRequest, CreateCompletionRequest
    from pydantic import ValidationError

    try:
        request = json.loads(body)
    except ValueError as exc:
        return f"the request body is not JSON ({exc})"
    if not isinstance(request, dict):
        return "the request body is not a JSON object"
    kind = CreateChatCompletionRequest if path == "/v1/chat/completions" else CreateCompletionRequest
    try:
        kind.model_validate(request)
    except ValidationError as exc:
        first = exc.errors()[0]
        return f"{'.'.join(map(str, first['loc'])) or 'body'}: {first['msg']} ({exc.error_count()} problem(s))"
    return None


async def _send_json(send, status: int, payload: dict) -> None:
    body = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class GrammarCheckedGreedy:
    """Greedy decoding under a grammar that asks the grammar about the likeliest token first.

    llama-cpp-python samples a grammar-constrained answer through a chain (grammar, then greedy) that runs the
    grammar over every token of the vocabulary at every step: for SmolLM2's 49,152 tokens about 16 ms a token on
    2 cores, as long as the model itself takes (bench/grammar_sampling.py). llama.cpp's own sampler
    (common/sampling.cpp) first offers the grammar only the token it would pick, and applies it to the whole
    vocabulary only when that token is refused. Under greedy decoding the token is the same either way: the
    likeliest token, when the grammar allows it, is the likeliest of those it allows; ties go to the lowest id in
    both (numpy's argmax, llama.cpp's greedy sampler). llama-cpp-python has no such option, so this object takes
    the chain's place (`Llama._init_sampler`, patched in `check_grammar_first`) for the requests it fits."""

    def __init__(self, llama: Any, grammar: Any):
        import llama_cpp

        self._lib = llama_cpp
        self._n_vocab = llama.n_vocab()
        self._grammar = llama_cpp.llama_sampler_init_grammar(
            llama._model.vocab, grammar._grammar.encode("utf-8"), grammar._root.encode("utf-8")
        )
        self._one = (llama_cpp.llama_token_data * 1)()
        self._every = (llama_cpp.llama_token_data * self._n_vocab)()
        self._every_view = np.ctypeslib.as_array(self._every)  # fields id, logit, p
        self._every_view["id"] = np.arange(self._n_vocab)

    def _apply_grammar(self, data: Any, size: int) -> None:
        candidates = self._lib.llama_token_data_array(ctypes.cast(data, self._lib.llama_token_data_p), size, -1, False)
        self._lib.llama_sampler_apply(self._grammar, ctypes.byref(candidates))

    def sample(self, ctx: Any, idx: int = -1) -> int:
        logits = np.ctypeslib.as_array(self._lib.llama_get_logits_ith(ctx.ctx, idx), shape=(self._n_vocab,))
        token = int(logits.argmax())
        self._one[0] = self._lib.llama_token_data(token, float(logits[token]), 0.0)
        self._apply_grammar(self._one, 1)
        if self._one[0].logit == -np.inf:  # refused: the grammar over every token, then the likeliest left
            self._every_view["logit"] = logits
            self._every_view["p"] = 0.0
            self._apply_grammar(self._every, self._n_vocab)
            token = int(self._every_view["logit"].argmax())
        self._lib.llama_sampler_accept(self._grammar, token)
        return token

    def close(self) -> None:
        if self._grammar is not None:
            self._lib.llama_sampler_free(self._grammar)
            self._grammar = None

    def __del__(self) -> None:
        self.close()


def check_grammar_first() -> None:
    """Has llama-cpp-python's `Llama` sample greedy answers under a grammar with GrammarCheckedGreedy: a request at
    temperature 0 with a grammar and neither penalties nor logits processors (whose chain is exactly grammar,
    then greedy). Any other request keeps llama-cpp-python's own chain, and so does every request of a
    llama-cpp-python without the internals this relies on (the lock pins the version it was written for): the
    engine then says so on stderr and answers as before."""
    import llama_cpp
    from llama_cpp import Llama

    chain = getattr(Llama, "_init_sampler", None)
    if getattr(chain, "checks_grammar_first", False):
        return
    needed = ("llama_sampler_init_grammar", "llama_sampler_apply", "llama_sampler_accept", "llama_get_logits_ith")
    if chain is None or not all(hasattr(llama_cpp, name) for name in needed):
        logging.getLogger(__name__).warning(
            "llama-cpp-python %s lacks what the grammar check needs; greedy answers under a grammar are sampled "
            "its own (slower) way",
            llama_cpp.__version__,
        )
        return

    def init_sampler(self: Any, *args: Any, **kwargs: Any) -> Any:
        grammar = kwargs.get("grammar")
        neutral = (
            not args
            and kwargs.get("temp") == 0.0
            and kwargs.get("logits_processor") is None
            and kwargs.get("repeat_penalty", 1.0) == 1.0
            and kwargs.get("frequency_penalty", 0.0) == 0.0
            and kwargs.get("presence_penalty", 0.0) == 0.0
        )
        if grammar is not None and neutral:
            return GrammarCheckedGreedy(self, grammar)
        return chain(self, *args, **kwargs)

    # both as Any: mypy types Llama only where llama-cpp-python is installed (not in `make test`'s environment)
    patched: Any = init_sampler
    patched.checks_grammar_first = True
    owner: Any = Llama
    owner._init_sampler = patched


def main(argv: list[str] | None = None) -> int:
    import uvicorn
    from llama_cpp.server.app import create_app
    from llama_cpp.server.cli import add_args_from_model, parse_model_from_args
    from llama_cpp.server.settings import ModelSettings, ServerSettings, Settings

    parser = argparse.ArgumentParser(
        prog="python -m mirrorapi.llama_cpp_engine", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    add_args_from_model(parser, Settings)
    parser.add_argument(
        "--check_grammar_first",
        type=lambda value: value.lower() in ("1", "true", "yes"),
        default=True,
        help="greedy answers under a grammar ask it about the likeliest token first (GrammarCheckedGreedy; "
        "false: llama-cpp-python's own sampling, for comparison)",
    )
    threads = len(os.sched_getaffinity(0))
    parser.set_defaults(**SERVER_DEFAULTS, n_threads=threads, n_threads_batch=threads)
    args = parser.parse_args(argv)
    if args.check_grammar_first:
        check_grammar_first()
    # llama-cpp-python annotates parse_model_from_args as returning the class it is given, not an instance
    # (mypy then refuses create_app's arguments where the package is installed): the values are instances.
    server: Any = parse_model_from_args(ServerSettings, args)
    model: Any = parse_model_from_args(ModelSettings, args)
    app = OpenAIDialect(create_app(server_settings=server, model_settings=[model]))
    uvicorn.run(app, host=server.host, port=server.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
