"""ToolEyes' tool library as a tools folder the registry and the virtual server load.

ToolEyes (Junjie-Ye/ToolEyes, Apache-2.0, read at commit c818fcebe017951570a25e552a7984e40093fd52) ships its
tools as `Tool_Library/<Category>/<Tool>/config_gpt4.json`: one OpenAI function-calling list per tool (the
`tool.py` beside it calls the real web API). Every list ends with two functions that are the agent's own
controls, not tools: `ask_to_user` and `finish`; they are left out here. The rest is copied unchanged to
`<out>/<Category>/<Tool>.json`, the layout `ToolRegistry.add_tools_folder` reads function files in (the
project's function-schema import, `mirrorapi.tools.functions_tool_json`): category = ToolEyes' category,
tool = its folder name, each function one API answered by the virtual server (cache, else simulator).
data/tooleyes/tools is this copy (its README names the source and commit); `write_tools_folder` makes it again
from a checkout of ToolEyes.
"""

from __future__ import annotations

import json
from pathlib import Path

CONTROLS = ("ask_to_user", "finish")  # ToolEyes' agent controls, in every config
CONFIG = "config_gpt4.json"


def library_tools(tool_library: str | Path) -> dict[tuple[str, str], list[dict]]:
    """(category, tool) -> its functions without the controls, from ToolEyes' `Tool_Library` folder."""
    root = Path(tool_library)
    configs = sorted(root.glob(f"*/*/{CONFIG}"))
    if not configs:
        raise FileNotFoundError(f"{root}: no */*/{CONFIG} (expected ToolEyes' Tool_Library folder)")
    out = {}
    for config in configs:
        functions = json.loads(config.read_text(encoding="utf-8"))
        out[(config.parent.parent.name, config.parent.name)] = [f for f in functions if f.get("name") not in CONTROLS]
    return out


def write_tools_folder(tool_library: str | Path, out: str | Path) -> dict[str, int]:
    """Copy the library's function lists to `<out>/<Category>/<Tool>.json`; counts of tools and functions."""
    tools = library_tools(tool_library)
    for (category, tool), functions in tools.items():
        path = Path(out) / category / f"{tool}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(functions, ensure_ascii=False) + "\n", encoding="utf-8")
    return {
        "categories": len({c for c, _ in tools}),
        "tools": len(tools),
        "functions": sum(len(f) for f in tools.values()),
    }
