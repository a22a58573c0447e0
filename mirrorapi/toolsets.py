"""Toolsets (a chosen set of APIs) and their function schemas, for MCP and OpenAI function calling.

A toolset is written like a URL query string, so that one syntax serves the server's setting
(`mcp_toolset`), the MCP URL (`/mcp?category=Data&tool=APIBank/apibank_account`) and
`mirrorapi tools export --toolset ...`:
- `category=<Category>`: every API of every tool of a category;
- `tool=<Category>/<tool>`: every API of a tool;
- `api=<Category>/<tool>/<api>`: one API;
- `query=<query_id>`: the `api_list` of a StableToolBench query from a query file the registry loaded.
Keys repeat and mix; names are taken as clients send them (`ToolRegistry.resolve`). The empty
toolset is every API of the registry.

Function names are the APIs' wire names (`transfermarkt_search`); an API name that two tools of the
toolset share gets ToolBench's `<api>_for_<tool>` instead. Names are cut to 64 characters
(OpenAI's limit; MCP allows 128) with a numbered suffix should a cut collide; a character OpenAI's names
refuse (a Chinese API name's) becomes "_", and the name is made a wire name again (underscores run together,
none at the ends), so that it loads back as itself. The input schema is a
JSON schema built from the doc: wire parameter names, JSON types (an array's items of any type),
descriptions, defaults converted to the type (dropped where they do not convert), and `required` (each
name once). A parameter imported from an OpenAI function file keeps its own
schema. Exporting to OpenAI's format and loading the file back (`ToolRegistry`) gives the same
functions again.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from mirrorapi.names import api_key_name, standardize, standardize_category
from mirrorapi.tools import ApiDoc, ToolRegistry, UnknownName

TOOLSET_KEYS = ("category", "tool", "api", "query")
MAX_TOOLSET_ITEMS = 256  # distinct items of a spec (a URL's query string): each costs a lookup, some a category's APIs
NAME_LIMIT = 64
# What OpenAI's function names allow (`^[a-zA-Z0-9_-]{1,64}$`); MCP's also allow ".", which OpenAI refuses: one
# name for both formats.
_INVALID_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")
# RapidAPI / ToolBench parameter types -> JSON schema types (anything else is a string: ENUM, DATE, ...)
_JSON_TYPES = {
    "STRING": "string",
    "NUMBER": "number",
    "INTEGER": "integer",
    "INT": "integer",
    "FLOAT": "number",
    "BOOLEAN": "boolean",
    "BOOL": "boolean",
    "ARRAY": "array",
    "LIST": "array",
    "OBJECT": "object",
    "DICT": "object",
    "STR": "string",
}


class ToolsetError(ValueError):
    """A toolset that names something unknown or is written wrong; the message says which."""


@dataclass(frozen=True)
class Toolset:
    functions: dict[str, ApiDoc]  # function name -> doc, in a stable order
    # What a door makes of the toolset and answers again and again (OpenEnv's tool list, as JSON): kept with it, so
    # it is forgotten when the toolset is.
    made: dict[str, str] = field(default_factory=dict, compare=False)


class ToolsetCache:
    """The toolsets of the specs used last: bounded, as a client could send endless distinct specs (a URL's query
    string, a reset's field), by their number and by the functions they hold together (a spec of every category of
    ToolEnv2404 holds 46,606, ~3.3 MB); the least recently used is forgotten first. Specs are keyed by what they
    name, not as spelt: `%63ategory=Social`, `category=Social&category=Social` are one toolset."""

    def __init__(self, registry: ToolRegistry, limit: int = 1024, functions_limit: int = 200_000):
        self.registry, self.limit, self.functions_limit = registry, limit, functions_limit
        self._toolsets: OrderedDict[tuple, Toolset] = OrderedDict()
        self._functions = 0

    def get(self, spec: str, max_functions: int | None = None) -> Toolset:
        """The toolset `spec` names; ToolsetError when it names nothing known, or more than `max_functions` APIs
        (then checked before it is made, and not kept)."""
        items = parse_toolset(spec)
        key = tuple(sorted(items))
        toolset = self._toolsets.get(key)
        if toolset is not None:
            self._toolsets.move_to_end(key)
        else:
            toolset = self._toolsets[key] = select_toolset(self.registry, items, max_functions)
            self._functions += len(toolset.functions)
            while len(self._toolsets) > 1 and (
                len(self._toolsets) > self.limit or self._functions > self.functions_limit
            ):
                self._functions -= len(self._toolsets.popitem(last=False)[1].functions)
        if max_functions is not None and len(toolset.functions) > max_functions:
            raise TooManyFunctions(len(toolset.functions), max_functions)
        return toolset


class TooManyFunctions(ToolsetError):
    """A toolset of more APIs than its user takes."""

    def __init__(self, functions: int, limit: int):
        super().__init__(f"it names {functions:,} APIs, more than {limit:,}")
        self.functions, self.limit = functions, limit


def parse_toolset(spec: str) -> list[tuple[str, str]]:
    """`category=Data&tool=APIBank/apibank_account` -> [("category", "Data"), ("tool", "APIBank/apibank_account")]."""
    # Blank values kept, to be refused: `foo` or `category=` once meant the empty toolset, every API
    items = list(dict.fromkeys(parse_qsl(spec or "", keep_blank_values=True)))  # an item named twice is one
    for key, value in items:
        if key not in TOOLSET_KEYS:
            raise ToolsetError(f"unknown toolset key {key!r} (known: {', '.join(TOOLSET_KEYS)})")
        if not value.strip():
            raise ToolsetError(f"toolset {key}= names nothing: give a value, e.g. {key}={_EXAMPLES[key]}")
    if len(items) > MAX_TOOLSET_ITEMS:
        raise ToolsetError(f"{len(items):,} toolset items: a toolset names at most {MAX_TOOLSET_ITEMS}")
    return items


def select_toolset(
    registry: ToolRegistry, spec: str | list[tuple[str, str]], max_functions: int | None = None
) -> Toolset:
    """The APIs a toolset names, with their function names; raises ToolsetError (`TooManyFunctions` past
    `max_functions`, counted before the function names are made: most of a large toolset's cost)."""
    items = parse_toolset(spec) if isinstance(spec, str) else spec
    docs: dict[tuple[str, str, str], ApiDoc] = {}
    try:
        if not items:
            docs = {(d.category, d.tool, d.api): d for d in registry}
        for key, value in items:
            # an API title may hold "/" (`packages/v2/track`); a category or tool name as clients send it cannot
            parts = value.split("/", 2)
            if key == "category":
                found = [
                    d for tool in registry.categories[_category(registry, value)].values() for d in tool.apis.values()
                ]
            elif key == "tool" and len(parts) == 2:
                found = list(registry.find_tool(*parts).apis.values())
            elif key == "api" and len(parts) == 3:
                found = [registry.resolve(*parts)]
            elif key == "query":
                if value not in registry.queries:
                    raise ToolsetError(
                        f"unknown query {value!r}: no query file loaded with the tools has that query_id"
                    )
                found = [registry.resolve(*names) for names in registry.queries[value]]
            else:
                raise ToolsetError(f"toolset {key}={value!r}: expected {_FORMS[key]}")
            docs.update({(d.category, d.tool, d.api): d for d in found})
    except UnknownName as exc:
        raise ToolsetError(str(exc)) from None
    if max_functions is not None and len(docs) > max_functions:
        raise TooManyFunctions(len(docs), max_functions)
    return Toolset(function_names(sorted(docs.values(), key=lambda d: (d.category, d.tool, d.api))))


_FORMS = {"tool": "<Category>/<tool>", "api": "<Category>/<tool>/<api>"}
_EXAMPLES = {
    "category": "Data",
    "tool": "APIBank/apibank_account",
    "api": "APIBank/apibank_account/GetUserToken",
    "query": "588",
}


def _category(registry: ToolRegistry, name: str) -> str:
    category = standardize_category(name)
    if category not in registry.categories:
        raise UnknownName("category", name, "", difflib.get_close_matches(category, registry.categories, n=3))
    return category


def function_names(docs: list[ApiDoc]) -> dict[str, ApiDoc]:
    """Function name -> doc (see the module doc for the naming rule)."""
    tools_per_api: dict[str, set] = {}
    for doc in docs:
        tools_per_api.setdefault(doc.api, set()).add((doc.category, doc.tool))
    named: dict[str, ApiDoc] = {}
    for doc in docs:
        name = doc.api if len(tools_per_api[doc.api]) == 1 else f"{doc.api}_for_{standardize(doc.tool)}"
        # A wire name again (api_key_name leaves it as it is): loaded back from an OpenAI file, each function keeps
        # its name, where "生日_____" exported as "_______" was read back as "" and merged with every other such name.
        name = api_key_name(_INVALID_NAME_CHARS.sub("_", name))[:NAME_LIMIT].rstrip("_") or "api"
        unique, number = name, 2
        while unique in named:
            suffix = f"_{number}"
            unique, number = name[: NAME_LIMIT - len(suffix)].rstrip("_") + suffix, number + 1
        named[unique] = doc
    return named


# ------------------------------------------------------------------------------------ schemas
def _typed_default(value: Any, json_type: str) -> Any:
    """A doc's default as a value of the parameter's type; None when it is empty or does not convert (a schema's
    default should validate against it: an array's "2" is no array, a number's [] no number, an integer's "1.5" no
    integer; NaN and Infinity are no JSON)."""
    if value in ("", None):
        return None
    if json_type in ("array", "object"):
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                return None
        return value if isinstance(value, list if json_type == "array" else dict) else None
    if json_type in ("number", "integer"):
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                return None
            value = int(number) if number.is_integer() and (json_type == "integer" or "." not in value) else number
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        if json_type == "integer" and isinstance(value, float):
            return int(value) if value.is_integer() else None
        return value
    if json_type == "boolean":
        if isinstance(value, str):
            return {"true": True, "false": False}.get(value.strip().lower())
        if value in (0, 1) and isinstance(value, int):  # 0 and 1, as docs write a flag
            return bool(value)
        return value if isinstance(value, bool) else None
    if json_type == "string" and not isinstance(value, str):
        return str(value)
    return value


def parameter_schema(param: dict) -> dict:
    if isinstance(param.get("schema"), dict):  # imported from an OpenAI function file: its own schema
        return param["schema"]
    json_type = _JSON_TYPES.get(str(param.get("type", "")).strip().upper(), "string")
    schema: dict[str, Any] = {"type": json_type}
    if json_type == "array":  # items of any type: the docs say none, and OpenAI refuses an array without `items`
        schema["items"] = {}
    if param.get("description"):
        schema["description"] = str(param["description"])
    default = _typed_default(param.get("default"), json_type)
    if default is not None:
        schema["default"] = default
    return schema


def input_schema(doc: ApiDoc) -> dict:
    """The JSON schema of an API's arguments, with the wire names agents send (`is_id`, not `id`)."""
    properties = {
        api_key_name(p["name"]): parameter_schema(p) for p in doc.required_parameters + doc.optional_parameters
    }
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    # Unique, as JSON Schema wants `required` (some docs list a parameter twice: ToolEnv2404's getCVEBySeverity)
    required = list(dict.fromkeys(api_key_name(p["name"]) for p in doc.required_parameters))
    if required:
        schema["required"] = required
    return schema


def description(doc: ApiDoc) -> str:
    return (doc.description or doc.tool_description).strip()


def openai_function(name: str, doc: ApiDoc) -> dict:
    return {
        "type": "function",
        "function": {"name": name, "description": description(doc), "parameters": input_schema(doc)},
    }


def mcp_tool(name: str, doc: ApiDoc) -> dict:
    """An MCP `Tool` as JSON; `_meta` names the API as /virtual knows it."""
    return {
        "name": name,
        "title": f"{doc.api_title} ({doc.tool_title})",
        "description": description(doc),
        "inputSchema": input_schema(doc),
        "_meta": {"mirrorapi/api": {"category": doc.category, "tool": doc.tool, "api": doc.api}},
    }


def export_toolset(toolset: Toolset, fmt: str) -> list[dict]:
    """The toolset's function schemas in `openai` or `mcp` form."""
    if fmt == "openai":
        return [openai_function(name, doc) for name, doc in toolset.functions.items()]
    if fmt == "mcp":
        return [mcp_tool(name, doc) for name, doc in toolset.functions.items()]
    raise ToolsetError(f"unknown export format {fmt!r} (known: openai, mcp)")
