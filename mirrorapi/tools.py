"""Tool documentation: `ToolRegistry` loads ToolBench tools folders once and resolves names in memory.

Sources, merged in the order given (the first doc of an API wins; later sources only fill gaps):
- a ToolBench tools folder `<Category>/<std_tool>.json` (StableToolBench's `tools_folder`);
- a StableToolBench query file (a JSON list of queries whose `api_list` entries are partial docs);
- an OpenAI function-calling file (a JSON list of `{name, description, parameters}` or
  `{"type": "function", "function": {...}}`), loaded as one tool; inside a tools folder, such a file at
  `<Category>/<tool>.json` is that tool (ToolEyes' library, data/tooleyes/, is laid out so).

Names are resolved the way StableToolBench's clients send them (see `ToolRegistry.resolve`).

Kept as one module near 400 lines on purpose: the doc types, the source readers and the resolver all work on
the registry's indexes (by category, standardised tool and API name), and the compiled index
(`tools_index`) already lives apart; splitting the class would spread one set of invariants over several files.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rapidfuzz import fuzz, process

from mirrorapi import tools_index
from mirrorapi.names import api_key_name, standardize, standardize_category

logger = logging.getLogger(__name__)

PARAM_KEYS = ("name", "type", "description", "default")
# Longer names are unknown without a closest-name search (the longest ToolEnv2404 API name has 817
# characters, its longest tool name 86); at most ECHO_CHARS of an unknown name are quoted back.
MAX_NAME_CHARS = 1024
ECHO_CHARS = 64


class RegistryError(Exception):
    """A source that cannot be used at all (a folder that does not exist, a file of the wrong shape)."""


class UnknownName(LookupError):
    """A category, tool or API that the registry does not know; carries the closest known names."""

    def __init__(self, kind: str, name: str, where: str, suggestions: list[str]):
        self.kind, self.name, self.where, self.suggestions = kind, name, where, suggestions
        shown = repr(name) if len(name) <= ECHO_CHARS else f"{name[:ECHO_CHARS]!r}... ({len(name):,} characters)"
        message = f"Unknown {kind} {shown}{where}."
        if suggestions:
            message += " Closest known: " + ", ".join(suggestions) + "."
        super().__init__(message)


@dataclass(slots=True)
class ApiDoc:
    """One API's documentation, with both its normalised and its original names."""

    category: str  # normalised category, the folder name (`Data`)
    tool: str  # standardized tool name, the file stem (`theclique`)
    api: str  # the name agents send: change_name(standardize(name)) (`transfermarkt_search`)
    tool_title: str  # original names (`TheClique`, `Transfermarkt search`)
    api_title: str
    tool_description: str = ""
    description: str = ""
    method: str = "GET"
    required_parameters: list[dict] = field(default_factory=list)  # {name, type, description, default[, schema]}
    optional_parameters: list[dict] = field(default_factory=list)
    template_response: Any = None  # ToolBench type skeleton, e.g. {"token": "str"}
    response_schema: dict | None = None  # JSON schema of the response (ToolEnv2404 `schema`)
    source: str = ""  # where the doc came from (file path)

    def parameter_names(self) -> tuple[list[str], list[str]]:
        """Wire names (as agents send them) of the required and optional parameters."""
        return (
            [api_key_name(p["name"]) for p in self.required_parameters],
            [api_key_name(p["name"]) for p in self.optional_parameters],
        )

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}


ARGUMENT_POLICIES = ("reject", "simulate")


class ArgumentError(ValueError):
    """Arguments the API would refuse (a missing required argument, an unknown one): per the policy."""


def check_arguments(doc: ApiDoc, arguments: dict, missing_required: str, unknown_arguments: str) -> None:
    """Apply the argument policy (`reject` raises ArgumentError, whose text is the refusal a client gets; `simulate`
    lets the model answer): the virtual server's check of a call, and the data builder's of a history's calls."""
    required, optional = doc.parameter_names()
    if missing_required == "reject":
        missing = [name for name in required if name not in arguments]
        if missing:
            names = ", ".join(repr(n) for n in missing)
            raise ArgumentError(
                f"Missing required parameter{'s' if len(missing) > 1 else ''} {names} "
                f"of {doc.api_title} ({doc.tool_title})."
            )
    if unknown_arguments == "reject":
        known = set(required) | set(optional)
        unknown = [name for name in arguments if name not in known]
        if unknown:
            raise ArgumentError(f"{doc.api}() got an unexpected keyword argument {unknown[0]!r}")


@dataclass(slots=True)
class Tool:
    category: str
    name: str  # standardized (file stem)
    title: str  # original tool name
    description: str = ""
    apis: dict[str, ApiDoc] = field(default_factory=dict)  # keyed by the API's wire name


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def _maybe_json(value: Any) -> Any:
    """`template_response` / `schema` come as objects, JSON strings, or `""`; normalise to an object or None."""
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            return json.loads(value)
        except (ValueError, RecursionError):  # RecursionError: nested past Python's limit
            return value
    return value if value not in ({}, []) else None


def _params(value: Any) -> list[dict]:
    if not isinstance(value, list):
        return []
    out = []
    for p in value:
        # "" is a name: the wire name of ToolEnv2404's `/` (apk_downloader), which an exported file holds
        if not isinstance(p, dict) or not isinstance(p.get("name"), str):
            continue
        if all(isinstance(p.get(k), str) for k in ("name", "type", "description")) and "default" in p:
            out.append(p)  # the common case: keep the parsed dict as is (load speed)
            continue
        clean = {
            "name": _text(p.get("name")),
            "type": _text(p.get("type")) or "STRING",
            "description": _text(p.get("description")),
            "default": p.get("default", ""),
        }
        if "schema" in p:
            clean["schema"] = p["schema"]
        out.append(clean)
    return out


def _layout_hint(folder: Path) -> str:
    """Where the tools of a folder without any may be: its subfolders laid out as a tools folder, or its parent when
    it holds tool files itself (a category folder)."""

    def holds_tool_files(path: str) -> bool:
        return any(entry.name.endswith(".json") and entry.is_file() for entry in os.scandir(path))

    try:
        children = sorted(entry.path for entry in os.scandir(folder) if entry.is_dir())
        layouts = [c for c in children if any(e.is_dir() and holds_tool_files(e.path) for e in os.scandir(c))]
        if layouts:
            return "; did you mean " + " or ".join(layouts[:3]) + "?"
        if holds_tool_files(str(folder)):
            return f" (it holds <tool>.json files itself, as a category folder does); did you mean {folder.parent}?"
    except OSError:  # only a hint
        pass
    return ""


def _closest(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """Up to `n` known names most similar to `name` (rapidfuzz: C speed, on names capped at MAX_NAME_CHARS)."""
    if len(name) > MAX_NAME_CHARS:
        return []
    known = list(known)
    found = [match for match, _, _ in process.extract(name, known, scorer=fuzz.ratio, limit=n, score_cutoff=60)]
    if not found:  # a prefix/substring hint is still better than nothing
        found = [k for k in known if name and (name in k or k in name)][:n]
    return found


class ToolRegistry:
    """All tool docs in memory, indexed by normalised names; lookups are dictionary lookups."""

    def __init__(self) -> None:
        self.categories: dict[str, dict[str, Tool]] = {}
        self._aliases: dict[tuple[str, str], str] = {}  # (category, standardize(tool_name)) -> file stem
        self.unreadable: list[tuple[str, str]] = []  # (file, reason): skipped, never fatal
        # An API a file lists again under a wire name it already has (the first is the API, as upstream takes it):
        # (category, tool, title); `tools stats` counts them, so that what a folder leaves unreachable is seen.
        self.listed_again: list[tuple[str, str, str]] = []
        # StableToolBench queries seen in query files: query_id -> the (category, tool, api) of its api_list
        self.queries: dict[str, list[tuple[str, str, str]]] = {}
        self.query_texts: dict[str, str] = {}  # query_id -> the query's text (the task an agent is given)
        self.load_seconds = 0.0
        self.indexes: list[tuple[str, str]] = []  # (tools folder, "read" | "written" | "not written") per folder

    # ----------------------------------------------------------------------------------- loading
    @classmethod
    def load(cls, sources: Iterable[str | os.PathLike]) -> ToolRegistry:
        """Load tools folders, query files and OpenAI function files (detected by shape)."""
        registry = cls()
        start = time.perf_counter()
        # Hundreds of thousands of new long-lived objects: the garbage collector's passes over them while
        # they are made find nothing to free and cost a third of the load.
        collecting = gc.isenabled()
        gc.disable()
        try:
            for source in sources:
                registry.add(source)
        finally:
            if collecting:
                gc.enable()
        registry.load_seconds = time.perf_counter() - start
        return registry

    def add(self, source: str | os.PathLike) -> None:
        path = Path(source)
        if path.is_dir():
            self.add_tools_folder(path)
            return
        if not path.exists():
            raise RegistryError(f"tool source not found: {path} (expected a tools folder or a JSON file)")
        try:  # a source alone: one line of error, and no "skipping unreadable tool file" warning before it
            with open(path, "rb") as fh:
                data = json.loads(fh.read())
        except (OSError, ValueError, RecursionError, MemoryError) as exc:
            if isinstance(exc, json.JSONDecodeError) and exc.msg == "Extra data" and exc.lineno > 1:
                raise RegistryError(
                    f"{path} is JSON Lines (one record a line), not a tool source: give a tools folder "
                    "(<Category>/<tool>.json), a StableToolBench query file or an OpenAI function list"
                ) from None
            raise RegistryError(f"cannot read {path}: {type(exc).__name__}: {exc}") from None
        if isinstance(data, list) and data and all(isinstance(q, dict) and "api_list" in q for q in data):
            self.add_query_list(data, source=str(path))
        elif _looks_like_functions(data):
            self.add_openai_functions(data, category="Custom", tool=standardize(path.stem), source=str(path))
        else:
            raise RegistryError(
                f"{path}: not a tools folder, a StableToolBench query file (a list of queries with `api_list`) "
                "or an OpenAI function list"
            )

    def add_tools_folder(self, folder: str | os.PathLike) -> None:
        """Load `<folder>/<Category>/<tool>.json`; unreadable files are recorded in `unreadable`. Through the
        folder's compiled index when it matches the folder as it is (`mirrorapi.tools_index`), else by reading
        every file, then writing the index for the next start."""
        folder = Path(folder)
        if not folder.is_dir():
            raise RegistryError(f"tools folder not found: {folder}")
        files, unlisted = tools_index.scan(folder)
        if not files and not unlisted:  # one level too high or too low, or empty: 0 tools and exit 0 said nothing
            raise RegistryError(f"tools folder {folder} holds no <Category>/<tool>.json file{_layout_hint(folder)}")
        for path, reason in unlisted:
            logger.warning("skipping tools folder %s (%s)", path, reason)
        self.unreadable.extend(unlisted)
        stamp, settled = tools_index.fingerprint(folder, files)
        index = tools_index.read(folder, stamp) if not unlisted else None
        if index is None:
            records, unreadable = [], []
            for category, stem, path, *_ in files:
                data = self._read_json(path)
                if data is None:
                    unreadable.append(self.unreadable.pop())
                elif isinstance(data, list) and _looks_like_functions(data):
                    records.append((category, stem, path, tools_index.trimmed(functions_tool_json(data, stem))))
                elif not isinstance(data, dict):
                    unreadable.append((path, "not a JSON object"))
                else:
                    records.append((category, stem, path, tools_index.trimmed(data)))
            # no index of a folder read in part (a folder that cannot be listed): its tools come back when it can be
            written = tools_index.write(folder, stamp, records, unreadable) if settled and not unlisted else None
            if written is not None:
                logger.info("tools index of %s written to %s", folder, written)
            self.indexes.append(
                (
                    str(folder),
                    "written"
                    if written is not None
                    else "not written"
                    if settled
                    else "not written: changed just now",
                )
            )
        else:
            self.indexes.append((str(folder), "read"))
            records, unreadable = index
            for path, reason in unreadable:
                logger.warning("skipping unreadable tool file %s (%s)", path, reason)
        self.unreadable.extend((item[0], item[1]) for item in unreadable)
        for category, stem, path, data in records:
            self._add_tool_json(standardize_category(category), stem, data, path)

    def _read_json(self, path: str | os.PathLike) -> Any:
        try:
            with open(path, "rb") as fh:
                return json.loads(fh.read())
        except (OSError, ValueError, RecursionError, MemoryError) as exc:  # ValueError: JSONDecodeError, bad UTF-8;
            # RecursionError: JSON nested past Python's limit (about 1,000 deep), which stopped the whole load;
            # MemoryError: a file larger than memory (a sparse one), which did too, with a traceback
            reason = f"{type(exc).__name__}: {exc}"
            logger.warning("skipping unreadable tool file %s (%s)", path, reason)
            self.unreadable.append((str(path), reason))
            return None

    def _tool(self, category: str, stem: str, title: str, description: str) -> Tool:
        tools = self.categories.setdefault(category, {})
        tool = tools.get(stem)
        if tool is None:
            tool = tools[stem] = Tool(category, stem, title or stem, description)
            # Clients send a tool's standardized name: its title's, or its file's where the file's name is not one
            # (ToolEyes' `API_BASKETBALL.json` is `api_basketball` to them). A file of exactly that name wins.
            for alias in {standardize(title) if title else stem, standardize(stem)} - {stem}:
                self._aliases.setdefault((category, alias), stem)
        elif description and not tool.description:
            tool.description = description
        return tool

    def _add_tool_json(self, category: str, stem: str, data: dict, source: str) -> None:
        title = _text(data.get("tool_name") or data.get("name") or stem)
        tool = self._tool(category, stem, title, _text(data.get("tool_description")))
        api_list = data.get("api_list")
        listed: set[str] = set()
        for api in api_list if isinstance(api_list, list) else []:
            if not isinstance(api, dict) or not api.get("name"):
                continue
            # A file listing one name twice (197 in ToolEnv2404): its first entry is the API, as upstream's client
            # takes the first match and stops (rapidapi.py's fetch_api_json). Filling the first's gaps from the
            # second gave 5 real APIs another API's required parameter, and correct calls were refused.
            key = api_key_name(_text(api.get("name")))
            if key in listed:
                self.listed_again.append((category, stem, _text(api.get("name"))))
                continue
            listed.add(key)
            self._add_api(tool, api, source)

    def _add_api(self, tool: Tool, api: dict, source: str) -> None:
        title = _text(api.get("name") or api.get("api_name"))
        key = api_key_name(title)
        doc = ApiDoc(
            category=tool.category,
            tool=tool.name,
            api=key,
            tool_title=tool.title,
            api_title=title,
            tool_description=tool.description,
            description=_text(api.get("description", api.get("api_description"))),
            method=_text(api.get("method")) or "GET",
            required_parameters=_params(api.get("required_parameters")),
            optional_parameters=_params(api.get("optional_parameters")),
            template_response=_maybe_json(api.get("template_response")),
            response_schema=_maybe_json(api.get("schema")) if isinstance(api.get("schema"), (dict, str)) else None,
            source=source,
        )
        if not isinstance(doc.response_schema, dict):
            doc.response_schema = None
        existing = tool.apis.get(key)
        if existing is None:
            tool.apis[key] = doc
            return
        # First doc wins (upstream takes the first matching API); later sources only fill gaps.
        for name in ("description", "template_response", "response_schema", "tool_description"):
            if not getattr(existing, name) and getattr(doc, name):
                setattr(existing, name, getattr(doc, name))
        if not existing.required_parameters and not existing.optional_parameters:
            existing.required_parameters, existing.optional_parameters = (
                doc.required_parameters,
                doc.optional_parameters,
            )

    def add_query_file(self, path: str | os.PathLike) -> None:
        data = self._read_json(path)
        if not isinstance(data, list):
            raise RegistryError(f"{path}: expected a StableToolBench query file (a JSON list of queries)")
        self.add_query_list(data, source=str(path))

    def add_query_list(self, queries: list, source: str = "") -> None:
        """Merge the partial docs of StableToolBench queries' `api_list` entries."""
        for query in queries:
            api_list = query.get("api_list") if isinstance(query, dict) else None
            names = []
            for api in api_list if isinstance(api_list, list) else []:
                if not isinstance(api, dict) or not api.get("api_name") or not api.get("tool_name"):
                    continue
                category = standardize_category(_text(api.get("category_name")))
                title = _text(api["tool_name"])
                stem = self._aliases.get((category, standardize(title)), standardize(title))
                tool = self._tool(category, stem, title, "")
                self._add_api(tool, api, source)
                names.append((category, tool.name, api_key_name(_text(api["api_name"]))))
            if isinstance(query, dict) and query.get("query_id") is not None and names:
                self.queries.setdefault(str(query["query_id"]), names)
                if isinstance(query.get("query"), str):
                    self.query_texts.setdefault(str(query["query_id"]), query["query"])

    def add_openai_functions(self, data: Any, category: str, tool: str, source: str = "") -> None:
        """One tool made of OpenAI function-calling schemas (`functions_tool_json`)."""
        self._add_tool_json(standardize_category(category), tool, functions_tool_json(data, tool), source)

    # ----------------------------------------------------------------------------------- lookup
    def find_tool(self, category: str, tool_name: str) -> Tool:
        """(category, tool) as clients send them: normalised names, or `<tool>_for_<Category>`."""
        for kind, name in (("category", category), ("tool", tool_name)):
            if len(name) > MAX_NAME_CHARS:  # never normalised nor searched: no known name is that long
                raise UnknownName(kind, name, "", [])
        cat = standardize_category(category)
        tools = self.categories.get(cat)
        if tools is None:
            raise UnknownName("category", category, "", _closest(cat, self.categories))
        name = standardize(tool_name)
        # Exact name first: tools such as `usa_jobs_for_it` contain `_for_` themselves; then the
        # `_for_<Category>` suffix is removed exactly (upstream cut at the first `_for_`: wrong for them).
        candidates = [name]
        suffix = "_for_" + standardize(cat)
        if name.endswith(suffix):
            candidates.append(name[: -len(suffix)])
        for candidate in candidates:
            stem = candidate if candidate in tools else self._aliases.get((cat, candidate))
            if stem is not None:
                return tools[stem]
        raise UnknownName("tool", tool_name, f" in category {cat!r}", _closest(candidates[-1], tools))

    def resolve(self, category: str, tool_name: str, api_name: str) -> ApiDoc:
        """The doc of an API as StableToolBench clients name it; raises `UnknownName` with suggestions."""
        tool = self.find_tool(category, tool_name)
        if len(api_name) > MAX_NAME_CHARS:
            raise UnknownName("API", api_name, f" for tool {tool.name!r} in category {tool.category!r}", [])
        name = api_key_name(api_name)
        doc = tool.apis.get(name)
        if doc is None:
            suffix = "_for_" + standardize(tool.name)  # a full function name `<api>_for_<tool>`, standardized whole
            if name.endswith(suffix):
                doc = tool.apis.get(name[: -len(suffix)])
        if doc is None:
            raise UnknownName(
                "API",
                api_name,
                f" for tool {tool.name!r} in category {tool.category!r}",
                _closest(name, tool.apis) or sorted(tool.apis)[:5],
            )
        return doc

    def get(self, category: str, tool: str, api: str) -> ApiDoc | None:
        """Exact lookup by normalised names (no suffix handling, no suggestions)."""
        found = self.categories.get(category, {}).get(tool)
        return found.apis.get(api) if found else None

    def __iter__(self):
        for tools in self.categories.values():
            for tool in tools.values():
                yield from tool.apis.values()

    def stats(self) -> dict:
        return {
            "categories": len(self.categories),
            "tools": sum(len(tools) for tools in self.categories.values()),
            "apis": sum(len(t.apis) for tools in self.categories.values() for t in tools.values()),
            "apis_with_response_schema": sum(1 for d in self if d.response_schema or d.template_response),
            "unreadable": len(self.unreadable),
            "apis_listed_again": len(self.listed_again),
            "unreadable_files": [{"file": f, "reason": r} for f, r in self.unreadable],
            "load_seconds": round(self.load_seconds, 3),
            "indexes": [f"{folder} ({how})" for folder, how in self.indexes],
        }


_JSON_TYPES = {
    "string": "STRING",
    "integer": "NUMBER",
    "number": "NUMBER",
    "boolean": "BOOLEAN",
    "array": "ARRAY",
    "object": "OBJECT",
}


def functions_tool_json(data: Any, tool: str) -> dict:
    """OpenAI function-calling schemas as a ToolBench tool file (`tool_name`, `api_list`): `required` decides
    required vs optional, each parameter keeps its own JSON schema (`schema`); malformed entries are skipped."""
    functions = data if isinstance(data, list) else [data]
    api_list = []
    for fn in functions:
        if isinstance(fn, dict) and fn.get("type") == "function" and isinstance(fn.get("function"), dict):
            fn = fn["function"]
        if not isinstance(fn, dict) or not fn.get("name"):
            continue
        schema: dict = fn["parameters"] if isinstance(fn.get("parameters"), dict) else {}
        required = set(schema.get("required") or [])
        props: dict = schema["properties"] if isinstance(schema.get("properties"), dict) else {}
        params: dict[bool, list] = {True: [], False: []}
        for name, prop in props.items():
            prop = prop if isinstance(prop, dict) else {}
            params[name in required].append(
                {
                    "name": name,
                    "type": _JSON_TYPES.get(str(prop.get("type")), "STRING"),
                    "description": _text(prop.get("description")),
                    "default": prop.get("default", ""),
                    "schema": prop,
                }
            )
        api_list.append(
            {
                "name": fn["name"],
                "description": fn.get("description"),
                "method": "POST",
                "required_parameters": params[True],
                "optional_parameters": params[False],
            }
        )
    return {"tool_name": tool, "api_list": api_list}


def _looks_like_functions(data: Any) -> bool:
    items = data if isinstance(data, list) else [data]
    return bool(items) and all(
        isinstance(f, dict) and (isinstance(f.get("function"), dict) or ("name" in f and "parameters" in f))
        for f in items
    )
