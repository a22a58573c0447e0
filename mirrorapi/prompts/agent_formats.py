"""The agent's prompt formats (the benchmark runner's model) and the reader of a text agent's replies.

Agent format
- `agent-v1`: the tool-using agent of the benchmark runner (StableToolBench's CoT / DFS protocol):
  a system prompt with the task rules and the tool list, the query as the user message, and the
  "try something different" message DFS sends before a sibling branch. Our own wording of the
  protocol StableToolBench's agents follow (think, call one function per step, finish with
  `Finish`, give up with `give_up_and_restart`). The functions go to the engine as OpenAI `tools`.
- `agent-react-v1`: the same protocol for a model whose engine cannot pass tool calls (a chat template
  without tool support, e.g. SmolLM2's): a text protocol in the layout ToolBench's ReAct-style agents
  used. The system prompt lists the functions with their JSON-schema arguments and asks for
  `Thought: ...` / `Action: <function name>` / `Action Input: <JSON object>`; each result comes back
  as a user message `Observation: <result>`. `parse_react_step` reads a reply into one call;
  `react_conversation` renders the runner's history (StableToolBench's messages: `tool_calls`,
  `tool` results) as that text, so answer files keep StableToolBench's format.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

import json_repair

AGENT_FORMATS = ("agent-v1", "agent-react-v1")
DEFAULT_AGENT_FORMAT = "agent-v1"
# Agent formats in which the model acts through its text, not through the engine's tool calls.
TEXT_AGENT_FORMATS = ("agent-react-v1",)


AGENT_SYSTEM_V1 = (
    "You are an agent that solves a user's task with the functions you are given.\n"
    "Work step by step. At each step, think briefly (at most five sentences) about where you stand and "
    "what to do next, then call one function to act. You will see the function's result and can decide "
    "on the next step.\n"
    "Rules:\n"
    "1. A step cannot be undone. When you are stuck, or the functions keep failing, call Finish with "
    'return_type "give_up_and_restart" to start over.\n'
    '2. Always end by calling Finish. With return_type "give_answer", put everything the user needs into '
    "final_answer: it is the only part the user sees.\n"
    "3. Call the functions by their own names, never by the tool names.\n"
    "Task: answer the user's real-time query with the functions. You can use these tools:\n"
    "{tools}"
)


AGENT_SYSTEM_REACT_V1 = (
    "You are an agent that solves a user's task with the functions listed below. You use a function by "
    "writing its name and arguments; its result is then shown to you.\n"
    "Reply to every message in exactly this layout, then stop:\n"
    "Thought: where you stand and what to do next, in at most five sentences\n"
    "Action: the name of ONE function from the list\n"
    "Action Input: the arguments of that function as one JSON object\n"
    'The result comes back to you as "Observation: ...". Do not write observations yourself.\n'
    "Rules:\n"
    '1. A step cannot be undone. When you are stuck, or the functions keep failing, write "Action: Finish" '
    'and "Action Input: {"return_type": "give_up_and_restart"}" to start over.\n'
    '2. Always end with "Action: Finish" and "Action Input: {"return_type": "give_answer", '
    '"final_answer": "..."}": the final answer is the only part the user sees, so make it complete.\n'
    "3. Use the function names exactly as listed, never the tool names.\n"
    "Task: answer the user's real-time query with the functions. You can use these tools:\n"
    "{tools}\n"
    "Functions (name: description; arguments as a JSON schema):\n"
    "{functions}"
)
REACT_OBSERVATION = "Observation: "
# What the model is told after a reply in which no `Action:` line was found.
REACT_NO_ACTION = (
    REACT_OBSERVATION + 'no action found in your reply. Reply with a "Thought:" line, an '
    '"Action:" line naming one function and an "Action Input:" line with its JSON arguments.'
)
# After the colon, markdown's closing `**` or `__` and spaces, but not the `_` that begins a function name (a name
# cut to its last 64 characters may: `_name_for_company_...`).
_REACT_LABEL = re.compile(
    r"^[\s*#>_`-]*(thought|action input|action|observation)[\s*_`]*:(?:[\s*]|_+(?=\s))*", re.IGNORECASE | re.MULTILINE
)
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def agent_function_list(functions: Sequence[dict]) -> str:
    """One line per function for text agent formats: `name: description; arguments: {json schema}`."""
    lines = []
    for schema in functions:
        function = schema.get("function", schema)
        parameters = json.dumps(function.get("parameters") or {}, ensure_ascii=False, separators=(",", ":"))
        lines.append(f"{function.get('name')}: {function.get('description') or ''}; arguments: {parameters}")
    return "\n".join(lines)


class ReactStep:
    """One `agent-react-v1` reply read as a step: the thought, at most one action and its arguments.

    `arguments` is the Action Input as the function gets it (a JSON string); `problem` says what was
    wrong with the reply's layout ("" when nothing was)."""

    def __init__(self, thought: str, action: str | None, arguments: str | None, problem: str = ""):
        self.thought, self.action, self.arguments, self.problem = thought, action, arguments, problem

    def __repr__(self) -> str:
        return f"ReactStep({self.thought!r}, {self.action!r}, {self.arguments!r}, {self.problem!r})"


def _react_arguments(text: str) -> tuple[str, str]:
    """(arguments, problem) from the text after `Action Input:`: JSON as written when it parses, else the
    object json_repair recovers (small models leave quotes and braces open), else the text as it is."""
    text = re.sub(r"^```(?:json)?\s*|\s*```\s*$", "", text.strip()).strip()
    if not text:
        return "{}", "empty Action Input"
    try:
        json.loads(text, strict=False)
        return text, ""
    except ValueError:
        pass
    if "{" in text:
        repaired = json_repair.loads(text[text.index("{") :])
        if isinstance(repaired, dict):
            return json.dumps(repaired, ensure_ascii=False), "Action Input repaired"
    return text, "Action Input is not JSON"


def parse_react_step(text: str) -> ReactStep:
    """Read an `agent-react-v1` reply. The first `Action:` is the step's one call; what follows an
    `Observation:` line the model wrote itself is dropped (it is not a result). Labels are matched
    without regard to case or markdown (`**Action:**`). An action without `Action Input` gets `{}`."""
    text = text or ""
    parts: list[tuple[str, str]] = []  # (label, text) in order
    found = list(_REACT_LABEL.finditer(text))
    lead = text[: found[0].start()] if found else text
    for index, match in enumerate(found):
        end = found[index + 1].start() if index + 1 < len(found) else len(text)
        parts.append((match.group(1).lower(), text[match.end() : end].strip()))
    thought_parts, action, arguments, problems = [lead.strip()] if lead.strip() else [], None, None, []
    for label, body in parts:
        if label == "observation":
            if action is not None:
                problems.append("wrote an Observation itself (dropped)")
            break
        if label == "thought" and action is None:
            thought_parts.append(body)
        elif label == "action" and action is None:
            name = _FUNCTION_NAME.match(body.strip("`'\"* "))
            action = name.group(0) if name else ""
        elif label == "action input" and action is not None and arguments is None:
            arguments, problem = _react_arguments(body)
            problems += [problem] if problem else []
        elif action is not None:
            problems.append("more than one action; the first is taken")
            break
    thought = "\n".join(thought_parts).strip()
    if action is None:
        return ReactStep(thought, None, None, "no Action line")
    if arguments is None:
        arguments, problems = "{}", problems + ["no Action Input"]
    return ReactStep(thought, action, arguments, "; ".join(problems))


# A JSON object in GBNF (llama.cpp's grammar language); whitespace kept short so a model cannot loop in it.
_GBNF_JSON = r"""object ::= "{" ws ( string ws ":" ws value ( ws "," ws string ws ":" ws value )* )? ws "}"
value ::= object | array | string | number | "true" | "false" | "null"
array ::= "[" ws ( value ( ws "," ws value )* )? ws "]"
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? [0-9]+ ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws ::= " "?
"""


def react_grammar(function_names: list[str], thought_chars: int = 400) -> str:
    """A GBNF grammar of one `agent-react-v1` reply: a one-line thought (at most `thought_chars` characters),
    one of `function_names`, a JSON object. For engines with grammar-constrained decoding (llama.cpp's
    servers take it as the request's `grammar`), so a model that does not keep the layout still acts."""
    names = " | ".join(json.dumps(name) for name in dict.fromkeys(function_names))
    return (
        f'root ::= "Thought: " thought "\\nAction: " action "\\nAction Input: " object\n'
        f"thought ::= [^\\n]{{1,{thought_chars}}}\naction ::= {names}\n" + _GBNF_JSON
    )


def render_react_step(thought: str, calls: list[tuple[str, str]]) -> str:
    """An assistant step (its text, its calls as (name, arguments)) in the `agent-react-v1` layout."""
    lines = [f"Thought: {thought.strip()}"] if thought and thought.strip() else []
    for name, arguments in calls:
        lines += [f"Action: {name}", f"Action Input: {arguments}"]
    return "\n".join(lines) or "Thought:"


def react_conversation(messages: list[dict]) -> list[dict]:
    """The runner's history (StableToolBench's messages) as `agent-react-v1` text messages: assistant steps
    rendered as Thought / Action / Action Input, each tool result as a user message `Observation: ...`,
    and after a reply without an action, the reminder of the layout."""
    out: list[dict] = []
    for message in messages:
        role, content = message.get("role"), message.get("content") or ""
        if role == "assistant":
            calls = [
                ((c.get("function") or {}).get("name", ""), (c.get("function") or {}).get("arguments", ""))
                for c in message.get("tool_calls") or []
            ]
            out.append({"role": "assistant", "content": render_react_step(content, calls)})
            if not calls:
                out.append({"role": "user", "content": REACT_NO_ACTION})
        elif role in ("tool", "function"):
            out.append({"role": "user", "content": REACT_OBSERVATION + content})
        else:
            out.append({"role": role, "content": content})
    return out


def agent_tool_list(tools: list[tuple[str, str]]) -> str:
    """The numbered tool list of the agent's system prompt: `1.<std_tool>: <description>`.

    Like StableToolBench's task description: at most 512 characters of a tool's description, newlines
    removed, `None` when it has none.
    """
    lines = []
    for number, (name, description) in enumerate(tools, 1):
        text = (description or "")[:512].replace("\n", "").strip() or "None"
        lines.append(f"{number}.{name}: {text}")
    return "\n".join(lines)


def agent_messages(
    query: str,
    tools: list[tuple[str, str]],
    fmt: str = DEFAULT_AGENT_FORMAT,
    system_prompt: str | None = None,
    functions: Sequence[dict] = (),
) -> list[dict]:
    """The first two messages of an agent run. `system_prompt` (a user's own text, e.g. from a file)
    replaces ours; `{tools}` in it is replaced by the tool list, `{functions}` by the function list
    (`functions`: the OpenAI tool schemas, which text formats show in the prompt)."""
    if fmt not in AGENT_FORMATS:
        raise ValueError(f"unknown agent prompt format {fmt!r}; known: {', '.join(AGENT_FORMATS)}")
    default = AGENT_SYSTEM_REACT_V1 if fmt == "agent-react-v1" else AGENT_SYSTEM_V1
    system = (system_prompt or default).replace("{tools}", agent_tool_list(tools))
    system = system.replace("{functions}", agent_function_list(functions))
    # The query between newlines and a closing "Begin!": the user-message layout StableToolBench's
    # agents were trained with.
    return [{"role": "system", "content": system}, {"role": "user", "content": f"\n{query}\nBegin!\n"}]


def agent_diversity_message(candidates: list[dict], observation: str = "") -> dict:
    """DFS's message before a sibling branch: earlier actions from this state, to be avoided."""
    text = (
        "Your earlier attempts from this point did not succeed. These are the actions you already took "
        "here:\n" + json.dumps(candidates, ensure_ascii=False, indent=2) + "\n"
    )
    if observation:
        text += f"The last observation before them was: {observation}\n"
    text += (
        "You are still in the middle of the task. Look at the current state and choose an action that "
        "differs from all of the above."
    )
    return {"role": "user", "content": text}
