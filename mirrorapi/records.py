"""The records the whole loop exchanges, read and written one way each.

- the cache key: `canonical_json` of the arguments (sorted keys, compact, UTF-8), so a call seen in
  training and a call seen by the server are the same call;
- an observation `{"error", "response"}` as compact JSON: `observation_json`;
- StableToolBench cache keys (Python reprs of the argument dict): `parse_repr_key`;
- JSONL files: `read_jsonl` (the one reader), pairs JSONL (`read_pairs_jsonl`, the schema of
  `../shared/data/pairs`), labelled final answers (`read_labelled`, the schema of `../shared/data/judge`)
  and StableToolBench `tool_response_cache` folders (`read_stabletoolbench_cache`);
- a built dataset's statistics file: `STATS_FILE`.

A record that cannot be read is reported to `on_bad(reason)` and skipped, never fatal; a file or
folder that does not exist raises `SourceError`.
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

from mirrorapi.names import standardize_category

# Encoders built once: `json.dumps` with arguments builds a new encoder on every call (a third of the cost
# of a small key, on every cache lookup). Same output as `json.dumps` with the same arguments.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def canonical_json(arguments: Any) -> str:
    """`{"b": 2, "a": 1}` -> `{"a":1,"b":2}`. Types are kept: `1` and `"1"` are different calls."""
    return _CANONICAL(arguments)


# Levels of arrays/objects a record may nest: real ones take a few (the shared pairs at most 5), and the code that
# walks a record recurses a level at a time (`utf8_only` twice), which Python stops at about 1,000 frames.
MAX_DEPTH = 200


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether `value`'s arrays/objects nest more than `limit` levels, walked a level at a time (no recursion)."""
    level = [value] if isinstance(value, (list, dict)) else []
    for _ in range(limit):
        if not level:
            return False
        level = [
            item
            for container in level
            for item in (container.values() if isinstance(container, dict) else container)
            if isinstance(item, (list, dict))
        ]
    return bool(level)


def utf8_only(value: Any) -> Any:
    """`value` (JSON data) with every string's surrogates made UTF-8: a pair (as a Python literal leaves it) joined
    into its character, a lone one ("\\ud83d" in JSON: half an emoji's pair) replaced by U+FFFD. No store, log or
    client body can hold a lone surrogate. Recursive, two frames a level: the readers below refuse what nests more than
    MAX_DEPTH, and the simulator's parser takes a RecursionError for an unreadable answer."""
    if isinstance(value, str):
        return value if value.isascii() else value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [utf8_only(item) for item in value]
    if isinstance(value, dict):
        return {utf8_only(key): utf8_only(item) for key, item in value.items()}
    return value


def parse_repr_key(key: str) -> Any:
    """A StableToolBench cache key (`str(dict)`: single quotes, `True`/`None`) -> the arguments it stands for.

    Raises ValueError when the key is neither a Python literal nor JSON.
    """
    try:
        # `inf` and `nan` as names: what `str()` writes for arguments JSON gave as 1e400 or NaN (StableToolBench
        # keys its cache so), which a literal cannot hold
        return ast.literal_eval(_NonFinite().visit(ast.parse(key.strip(), mode="eval")))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        try:
            return json.loads(key)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"not a StableToolBench cache key: {key[:80]!r}") from exc


class _NonFinite(ast.NodeTransformer):
    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Constant(float(node.id)) if node.id in ("inf", "nan") else node


def observation_json(error: str, response: Any) -> str:
    """The one serialisation of an observation: what the server answers, the cache stores and the
    simulator is trained to write (`mirrorapi-v1` targets): compact, UTF-8, `error` first."""
    return _COMPACT({"error": error, "response": response})


# The statistics a data builder writes beside a dataset's splits (read back by training for the model card).
STATS_FILE = "stats.json"

PAIR_KEYS = ("source", "episode", "step", "category", "tool_name", "api_name", "tool_input", "response")

OnBad = Callable[[str], None]


class SourceError(Exception):
    """An input that cannot be used at all (missing file or folder, wrong kind of file)."""


def ignore_bad(reason: str) -> None:
    pass


def read_jsonl(path: str | os.PathLike, on_bad: OnBad = ignore_bad) -> Iterator[tuple[int, Any]]:
    """The one JSONL reader: `(line number, value)` of every non-blank line. A line that is not JSON (a
    torn last line of an interrupted append, too) goes to `on_bad` as `<file>:<line>: not JSON`; callers
    check the values' shape and report problems the same way, `<file>:<line>: <reason>`. Lines are decoded
    one by one: a kill can cut a line inside a character, and that line alone is lost, not the file."""
    path = Path(path)
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                # A byte-order mark before the first line (Windows editors write one; RFC 8259 §8.1 lets a reader
                # ignore it) lost that line as "not JSON".
                value = json.loads(raw.decode("utf-8-sig" if number == 1 else "utf-8"))
            except UnicodeDecodeError:
                on_bad(f"{path.name}:{number}: not UTF-8")
                continue
            except ValueError:
                on_bad(f"{path.name}:{number}: not JSON")
                continue
            except RecursionError:  # nested past Python's limit (about 1,000 deep)
                on_bad(f"{path.name}:{number}: nested more than {MAX_DEPTH} levels deep")
                continue
            # Between MAX_DEPTH and Python's limit the parser reads it, and the code that walks it later raised
            # RecursionError mid-build; brackets are counted first, as walking every line would cost.
            if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and nested_deeper_than(value, MAX_DEPTH):
                on_bad(f"{path.name}:{number}: nested more than {MAX_DEPTH} levels deep")
                continue
            yield number, value


def read_pairs_jsonl(path: str | os.PathLike, on_bad: OnBad = ignore_bad) -> Iterator[dict]:
    """Pairs of one JSONL file, checked for the keys and types the builder relies on."""
    path = Path(path)
    if not path.is_file():  # checked now, not when the first pair is pulled
        raise SourceError(f"pairs file {'is a folder' if path.is_dir() else 'not found'}: {path}")
    return _pairs_jsonl(path, on_bad)


def _pairs_jsonl(path: Path, on_bad: OnBad) -> Iterator[dict]:
    for number, pair in read_jsonl(path, on_bad):
        problem = _pair_problem(pair)
        if problem:
            on_bad(f"{path.name}:{number}: {problem}")
            continue
        yield pair


def _pair_problem(pair: Any) -> str | None:
    if not isinstance(pair, dict):
        return "not a JSON object"
    missing = [k for k in PAIR_KEYS if k not in pair]
    if missing:
        return "missing " + ", ".join(missing)
    names = [k for k in ("source", "category", "tool_name", "api_name") if not isinstance(pair[k], str)]
    if names:
        return "non-string " + ", ".join(names)
    # the builder sorts and splits by (source, episode) and orders an episode by its integer step
    if not isinstance(pair["episode"], (str, int)) or isinstance(pair["episode"], bool):
        return "episode is not a string or an integer"
    if not isinstance(pair["step"], int) or isinstance(pair["step"], bool):
        return "step is not an integer"
    if not 0 <= pair["step"] < 2**63:  # 0-based (the pairs schema); the dataset's and the stores' columns are int64
        return "step is not from 0 to 2**63 - 1"
    if not isinstance(pair["tool_input"], dict):
        return "tool_input is not an object"
    response = pair["response"]
    if not isinstance(response, dict) or "response" not in response or not isinstance(response.get("error"), str):
        return "response is not {error: str, response: ...}"
    if utf8_only(pair) != pair:  # no UTF-8 store, prompt or request can hold one
        return "holds a lone surrogate (half an escape pair such as \\ud83d)"
    return None


JUDGE_KEYS = ("source", "id", "query", "final_answer", "label")
JUDGE_OPTIONAL_KEYS = ("reason", "label_kind")


def read_labelled(path: str | os.PathLike, on_bad: OnBad, labels: Collection[str] | None = None) -> Iterator[dict]:
    """Labelled final answers, the judge schema of `../shared/data/judge` (JUDGE_KEYS, optionally `reason`,
    `label_kind`, strings or null): what the judge's training data is built from and judge agreement is measured on.
    A bad line (or, with `labels`, a label outside them) goes to `on_bad` as `<file>:<line>: <reason>`."""
    path = Path(path)
    if not path.is_file():  # checked now, not when the first record is pulled
        raise SourceError(f"labelled answers file not found: {path}")
    return _labelled(path, on_bad, labels)


def _labelled(path: Path, on_bad: OnBad, labels: Collection[str] | None) -> Iterator[dict]:
    for number, record in read_jsonl(path, on_bad):
        missing = [k for k in JUDGE_KEYS if not isinstance(record, dict) or not isinstance(record.get(k), str)]
        if missing:
            on_bad(f"{path.name}:{number}: missing or non-string " + ", ".join(missing))
            continue
        # the optional keys go into prompts and a string column as they are (null is their absence)
        odd = [k for k in JUDGE_OPTIONAL_KEYS if record.get(k) is not None and not isinstance(record[k], str)]
        if odd:
            on_bad(f"{path.name}:{number}: non-string " + ", ".join(odd))
            continue
        if labels is not None and record["label"] not in labels:
            on_bad(f"{path.name}:{number}: label {record['label']!r} is not " + " or ".join(labels))
            continue
        yield record


def read_stabletoolbench_cache(folder: str | os.PathLike, on_bad: OnBad = ignore_bad) -> Iterator[dict]:
    """Pairs from a StableToolBench `tool_response_cache` folder (keys are Python reprs of the arguments)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SourceError(f"StableToolBench cache folder not found: {folder}")
    return _cache_folder(folder, on_bad)


def _cache_folder(folder: Path, on_bad: OnBad) -> Iterator[dict]:
    for cat_entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if not cat_entry.is_dir():
            continue
        category = standardize_category(cat_entry.name)
        suffix = "_for_" + category
        for tool_entry in sorted(os.scandir(cat_entry.path), key=lambda e: e.name):
            if not tool_entry.is_dir():
                continue
            # Exact suffix removal: tools like `usa_jobs_for_it` contain `_for_` themselves.
            tool = tool_entry.name[: -len(suffix)] if tool_entry.name.endswith(suffix) else tool_entry.name
            for api_entry in sorted(os.scandir(tool_entry.path), key=lambda e: e.name):
                if api_entry.name.endswith(".json") and api_entry.is_file():
                    yield from _cache_file(api_entry.path, category, tool, api_entry.name[: -len(".json")], on_bad)


def _cache_file(path: str, category: str, tool: str, api: str, on_bad: OnBad) -> Iterator[dict]:
    where = f"{category}/{tool}/{api}"  # the calls' names (their episode ids); reasons name the file as it is
    shown = "/".join(Path(path).parts[-3:])  # <cat>/<tool>_for_<cat>/<api>.json
    try:
        with open(path, "rb") as fh:
            entries = json.loads(fh.read())
    # MemoryError: a file larger than memory (a sparse one); RecursionError: nested past Python's limit
    except (OSError, ValueError, MemoryError, RecursionError) as exc:
        on_bad(f"{shown}: unreadable ({type(exc).__name__})")
        return
    if not isinstance(entries, dict):
        on_bad(f"{shown}: not a JSON object")
        return
    for number, (key, observation) in enumerate(entries.items()):
        try:
            arguments = parse_repr_key(key)
        except ValueError:
            on_bad(f"{shown}: unreadable key {key[:60]!r}")
            continue
        if nested_deeper_than([arguments, observation], MAX_DEPTH - 1):  # as `read_jsonl` refuses a line
            on_bad(f"{shown}: entry {key[:60]!r} nested more than {MAX_DEPTH} levels deep")
            continue
        if not isinstance(arguments, dict) or not all(isinstance(name, str) for name in arguments):
            on_bad(f"{shown}: key {key[:60]!r} is not an argument dict (names are strings)")
            continue
        try:
            canonical_json(arguments)  # what the store keys it by
        except (TypeError, ValueError, RecursionError):  # a set, bytes, a dict with mixed keys deeper in it
            on_bad(f"{shown}: key {key[:60]!r} holds values JSON cannot (a set, bytes, mixed keys)")
            continue
        if utf8_only(arguments) != arguments:  # no request can send these arguments (the server refuses them)
            on_bad(f"{shown}: key {key[:60]!r} holds a lone surrogate")
            continue
        if not isinstance(observation, dict) or "response" not in observation:
            on_bad(f"{shown}: value of {key[:60]!r} is not {{error, response}}")
            continue
        error = observation.get("error") or ""
        yield {
            "source": "stabletoolbench-cache",
            "episode": f"stb-cache:{where}#{number}",
            "step": 0,
            "category": category,
            "tool_name": tool,
            "api_name": api,
            "tool_input": arguments,
            "response": utf8_only(
                {"error": error if isinstance(error, str) else str(error), "response": observation["response"]}
            ),
        }
