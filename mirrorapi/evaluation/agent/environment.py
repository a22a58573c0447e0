"""The agent's side of a StableToolBench query: its functions, and the calls to `/virtual`.

Functions are built the way StableToolBench's `rapidapi_wrapper` builds them (notes §6), so a model
sees what it would see there and answer files stay comparable:
- name `<change_name(standardize(api))>_for_<std_tool>`, keeping the last 64 characters;
- description: the sentence naming the tool, then the API description (<= 256 characters, the API's
  name replaced by the function name);
- parameters: standardized names (`id` -> `is_id`), NUMBER -> integer, STRING -> string,
  BOOLEAN -> boolean, anything else -> string, descriptions <= 256 characters, the default as
  `example_value`;
- a `Finish` function with `return_type` (`give_answer` | `give_up_and_restart`) and `final_answer`.
Two upstream defects are not reproduced (notes §8.22): optional parameters are offered also when an
API has no required one, and the `required` list carries no empty-string element.

Docs come from the tools folder first and, for tools it lacks, from the query's own `api_list`.

A call goes to `/virtual` with StableToolBench's body (`category`, `tool_name`, `api_name`,
`tool_input` = the model's raw arguments string, `strip`, `toolbench_key`). The observation is the
server's JSON object dumped as upstream dumps it, cut to `max_observation_length` characters plus
`...`; its status code follows upstream's table (0 ok, 1 unknown function, 2 bad Finish, 3 final
answer, 4 give up, 6-11 the server's special error strings, 12 a non-200 or non-JSON answer).
Upstream's fixed 2-second pause before each call is not reproduced (it was a rate limit for the real
RapidAPI); a server that cannot be reached fails the query (`VirtualServerError`), so a rerun redoes it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass, field

import aiohttp

from mirrorapi.names import api_key_name
from mirrorapi.tools import ToolRegistry, UnknownName

# The virtual server's header on an answer that is its own failure that may pass (its engine or store away), read
# as any client reads it: the query is not written, so that a rerun asks again (the stages share no module).
RETRY_HEADER = "x-mirrorapi-retry"
FUNCTION_NAME_LIMIT = 64
DESCRIPTION_LIMIT = 256
_PARAM_TYPES = {"NUMBER": "integer", "STRING": "string", "BOOLEAN": "boolean"}
# The server's special error strings and the status codes StableToolBench's client gives them.
_ERROR_CODES = {
    "API not working error...": 6,
    "Unauthorized error...": 7,
    "Unsubscribed error...": 8,
    "Too many requests error...": 9,
    "Rate limit per minute error...": 10,
    "Message error...": 11,
}

FINISH = "Finish"
GIVE_ANSWER, GIVE_UP = "give_answer", "give_up_and_restart"
# Status codes (upstream's numbering).
OK, NO_SUCH_FUNCTION, BAD_FINISH, FINAL_ANSWER, GAVE_UP, REQUEST_ERROR = 0, 1, 2, 3, 4, 12

FINISH_FUNCTION = {
    "type": "function",
    "function": {
        "name": FINISH,
        "description": (
            "Call this function at the end of every attempt. When you have what the task asks for, "
            "give the final answer (the only part the user will see, so make it complete); when "
            "you cannot go on from the current state, give up and restart."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "return_type": {"type": "string", "enum": [GIVE_ANSWER, GIVE_UP]},
                "final_answer": {
                    "type": "string",
                    "description": "The final answer for the user; required with give_answer.",
                },
            },
            "required": ["return_type"],
        },
    },
}


class QueryError(Exception):
    """A query that cannot be run as given (none of its APIs has a doc)."""


class VirtualServerError(Exception):
    """The virtual server could not be reached or timed out: the query is not finished."""


@dataclass
class ToolFunction:
    name: str  # the function name the model calls
    category: str  # what /virtual gets
    tool: str
    api: str
    schema: dict  # {"type": "function", "function": {...}}


@dataclass
class QueryTools:
    """The functions of one query and the tool list of its system prompt."""

    functions: list[ToolFunction]
    tool_descriptions: list[tuple[str, str]]  # (std tool, description), first appearance order
    missing: list[str] = field(default_factory=list)  # api_list entries without any doc

    @property
    def schemas(self) -> list[dict]:
        return [f.schema for f in self.functions] + [FINISH_FUNCTION]

    def find(self, name: str) -> ToolFunction | None:
        """The function a model's call names: exact name first, then StableToolBench's suffix match
        (its client takes the first function whose name ends with the called name).

        Two APIs whose names are one after the 64-character cut: the call goes where upstream's goes, with the
        first function's tool and the API of the last one of that name (rapidapi.py's `api_name_reflect`, filled
        in `api_list` order, keeps the last)."""
        found = next((f for f in self.functions if f.name == name), None)
        if found is None and name:
            found = next((f for f in self.functions if f.name.endswith(name)), None)
        if found is None:
            return None
        last = [f for f in self.functions if f.name == found.name][-1]
        return found if last is found else dataclasses.replace(found, api=last.api)


def _parameter(param: dict) -> tuple[str, dict]:
    prop = {
        "type": _PARAM_TYPES.get(str(param.get("type", "")), "string"),
        "description": str(param.get("description") or "")[:DESCRIPTION_LIMIT],
    }
    default = param.get("default", "")
    if default is not None and len(str(default)) != 0:
        prop["example_value"] = default
    return api_key_name(str(param["name"])), prop


def function_schema(doc, tool_name: str) -> dict:
    """One API doc as an OpenAI tool, named and described as StableToolBench does."""
    name = f"{doc.api}_for_{tool_name}"[-FUNCTION_NAME_LIMIT:]
    # Upstream's fixed sentence (agents such as ToolLLaMA were trained on this exact layout).
    description = f'This is the subfunction for tool "{tool_name}", you can use this tool.'
    api_description = (doc.description or "").strip()
    if api_description:
        api_description = api_description.replace(doc.api_title, name)[:DESCRIPTION_LIMIT]
        description += f'The description of this function is: "{api_description}"'
    properties, required = {}, []
    for param in doc.required_parameters:
        key, prop = _parameter(param)
        properties[key] = prop
        required.append(key)
    for param in doc.optional_parameters:
        key, prop = _parameter(param)
        properties.setdefault(key, prop)
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def query_tools(query: dict, registry: ToolRegistry) -> QueryTools:
    """The functions of a StableToolBench query (`api_list` entries) from the registry.

    The registry should hold the tools folder and the query files (tools folder first: its docs win,
    the query's own `api_list` fills what the folder lacks).
    """
    functions: list[ToolFunction] = []
    descriptions: dict[str, str] = {}
    missing: list[str] = []
    seen: set[tuple[str, str, str]] = set()
    for item in query.get("api_list") or []:
        if not isinstance(item, dict):
            continue
        label = f"{item.get('category_name')}/{item.get('tool_name')}/{item.get('api_name')}"
        try:
            tool = registry.find_tool(str(item.get("category_name", "")), str(item.get("tool_name", "")))
        except UnknownName:
            missing.append(label)
            continue
        doc = tool.apis.get(api_key_name(str(item.get("api_name", ""))))
        if doc is None:
            missing.append(label)
            continue
        if (tool.category, tool.name, doc.api) in seen:
            continue
        seen.add((tool.category, tool.name, doc.api))
        schema = function_schema(doc, tool.name)
        functions.append(
            ToolFunction(
                schema["function"]["name"], str(item.get("category_name") or tool.category), tool.name, doc.api, schema
            )
        )
        descriptions.setdefault(tool.name, tool.description)
    if not functions:
        raise QueryError(
            "none of its api_list entries has a doc" + (f" ({', '.join(missing[:3])})" if missing else "")
        )
    return QueryTools(functions, list(descriptions.items()), missing)


def finish_status(arguments: str) -> tuple[str, int]:
    """(observation, status) of a Finish call, read as leniently as StableToolBench reads it."""
    try:
        data = json.loads(arguments, strict=False)
    except (ValueError, TypeError):
        data = None
    if not isinstance(data, dict):  # the model's JSON is broken: look for the fields in the text
        text, data = str(arguments or ""), {}
        for value in (GIVE_ANSWER, GIVE_UP):
            if f'"return_type": "{value}"' in text or f'"return_type":"{value}"' in text:
                data["return_type"] = value
        if '"final_answer"' in text:
            data["final_answer"] = text
    return_type = data.get("return_type")
    if return_type is None:
        return '{error:"must have "return_type""}', BAD_FINISH
    if return_type == GIVE_UP:
        return '{"response":"chose to give up and restart"}', GAVE_UP
    if return_type == GIVE_ANSWER:
        if "final_answer" not in data:
            return '{error:"must have "final_answer""}', BAD_FINISH
        return '{"response":"successfully giving the final answer."}', FINAL_ANSWER
    return '{error:""return_type" is not a valid choice"}', BAD_FINISH


class VirtualClient:
    """POSTs StableToolBench's request body to a `/virtual` URL over one pooled aiohttp session."""

    def __init__(
        self,
        url: str,
        timeout: float = 120.0,
        strip: str = "truncate",
        toolbench_key: str = "",
        max_connections: int = 256,
    ):
        self.url, self.timeout, self.strip, self.toolbench_key = url, timeout, strip, toolbench_key
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=self.max_connections),
                headers={"toolbench_key": self.toolbench_key},
            )
        return self._session

    async def call(self, function: ToolFunction, arguments: str) -> tuple[str, int]:
        """(observation, status code) of one call, before the length cut."""
        payload = {
            "category": function.category,
            "tool_name": function.tool,
            "api_name": function.api,
            "tool_input": arguments,
            "strip": self.strip,
            "toolbench_key": self.toolbench_key,
        }
        try:
            async with self._http().post(
                self.url, json=payload, timeout=aiohttp.ClientTimeout(total=self.timeout)
            ) as response:
                body = await response.read()
                status, retry = response.status, response.headers.get(RETRY_HEADER)
        except asyncio.TimeoutError:
            raise VirtualServerError(
                f"the virtual server at {self.url} did not answer within {self.timeout:g} s"
            ) from None
        except aiohttp.ClientError as exc:
            raise VirtualServerError(
                f"the virtual server at {self.url} is unreachable ({type(exc).__name__}: {exc})"
            ) from None
        if retry:  # the server's own failure (its simulator engine or store away), not the API's answer
            raise VirtualServerError(
                f"the virtual server at {self.url} could not answer for a cause of its own that may pass "
                f"({body[:200].decode('utf-8', 'replace')})"
            )
        if status != 200:
            return json.dumps(
                {"error": f"request invalid, data error. status_code={status}", "response": ""}
            ), REQUEST_ERROR
        try:
            data = json.loads(body)
        except ValueError:
            return json.dumps({"error": "request invalid, data error", "response": ""}), REQUEST_ERROR
        if not isinstance(data, dict):
            return json.dumps({"error": "request invalid, data error", "response": ""}), REQUEST_ERROR
        # json.dumps with its defaults (ASCII escapes), as upstream renders observations.
        return json.dumps(data), _ERROR_CODES.get(str(data.get("error")), OK)

    async def probe(self, timeout: float = 10.0) -> str | None:
        """None when the server answers HTTP at all, else why not."""
        try:
            async with self._http().post(self.url, json={}, timeout=aiohttp.ClientTimeout(total=timeout)):
                return None
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            return f"the virtual server at {self.url} is not reachable ({type(exc).__name__}: {exc})"

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def cut_observation(observation: str, limit: int) -> str:
    return observation if len(observation) <= limit else observation[:limit] + "..."


def unknown_function_observation(name: str) -> str:
    return json.dumps({"error": f"No such function name: {name}", "response": ""})
