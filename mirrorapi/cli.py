"""The `mirrorapi` command: `mirrorapi tools | cache | serve | benchmark | eval | data | train | models ...`.

One subcommand group per stage, each registered by the stage itself (`register` in its `commands.py`;
mirrorapi/command_line.py says how); the tools group, which every stage reads, is here. A call imports the
commands of its own stage only (`STAGES`). The entry scripts (eval/*.py, data/*.py, training/*.py,
serving/main_mirrorapi.py) run one of these commands alone.
Errors a user can fix (a missing folder, an unknown name) print one line and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence

from mirrorapi.command_line import Command, add_group, print_json, run_parsed
from mirrorapi.tools import RegistryError, ToolRegistry, UnknownName
from mirrorapi.toolsets import ToolsetError, export_toolset, parse_toolset, select_toolset
from mirrorapi.versions import mirrorapi_version

TOOLS_ERRORS = (RegistryError, UnknownName, ToolsetError)


# ------------------------------------------------------------------------------------------- tools
def tools_stats(args: argparse.Namespace) -> int:
    registry = ToolRegistry.load(args.sources)
    stats = registry.stats()
    if args.json:
        print_json(stats)
        return 0
    print(f"categories:   {stats['categories']:,}")
    print(f"tools:        {stats['tools']:,}")
    print(f"APIs:         {stats['apis']:,} ({stats['apis_with_response_schema']:,} with a response schema)")
    if stats["apis_listed_again"]:  # unreachable: a file's API under a wire name one listed before it has
        print(f"APIs a file lists again under a name it has (the first kept): {stats['apis_listed_again']:,}")
    print(f"unreadable:   {stats['unreadable']:,}")
    for item in stats["unreadable_files"][:20]:
        print(f"  {item['file']}: {item['reason']}")
    print(f"load time:    {stats['load_seconds']:.2f} s")
    return 0


def tools_show(args: argparse.Namespace) -> int:
    registry = ToolRegistry.load(args.tools)
    if args.api is not None:
        docs = [registry.resolve(args.category, args.tool, args.api)]
    else:
        docs = list(registry.find_tool(args.category, args.tool).apis.values())
    if args.json:
        print_json([d.to_dict() for d in docs] if args.api is None else docs[0].to_dict())
        return 0
    first = docs[0] if docs else None
    if first is not None:
        print(f"{first.category} / {first.tool_title} ({first.tool})")
        print(first.tool_description.strip() or "(no tool description)")
    for doc in docs:
        print(f"\n  {doc.method} {doc.api_title}  ->  api_name={doc.api}")
        if doc.description:
            print("    " + doc.description.strip().replace("\n", "\n    "))
        for kind, params in (("required", doc.required_parameters), ("optional", doc.optional_parameters)):
            for p in params:
                default = f" (default {p['default']!r})" if p.get("default") not in ("", None) else ""
                print(f"    [{kind}] {p['name']}: {p['type']}{default} {p['description'][:100]}".rstrip())
        if doc.template_response:
            print("    response template: " + json.dumps(doc.template_response, ensure_ascii=False)[:300])
    return 0


def tools_export(args: argparse.Namespace) -> int:
    registry = ToolRegistry.load(args.tools)
    spec = [
        *(("category", c) for c in args.category or ()),
        *(("tool", t) for t in args.tool or ()),
        *(("api", a) for a in args.api or ()),
        *(("query", q) for q in args.query or ()),
    ]
    schemas = export_toolset(select_toolset(registry, parse_toolset(args.toolset or "") + spec), args.format)
    text = json.dumps(schemas, ensure_ascii=False, indent=2) + "\n"
    if args.out:
        try:
            with open(args.out, "w", encoding="utf-8") as fh:
                fh.write(text)
        except OSError as exc:
            raise ToolsetError(f"cannot write --out {args.out}: {exc.strerror or exc}") from None
        print(f"{len(schemas):,} {args.format} function schemas written to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def tools_stats_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "sources", nargs="+", help="Tools folders, StableToolBench query files or OpenAI function files."
    )
    parser.add_argument("--json", action="store_true", help="Print one JSON object.")


def tools_show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("category")
    parser.add_argument("tool", help="Tool name as clients send it (`theclique`, `theclique_for_Data`).")
    parser.add_argument("api", nargs="?", help="API name as clients send it (`transfermarkt_search`).")
    parser.add_argument("--tools", nargs="+", required=True, metavar="SOURCE", help="Tools folders or files to load.")
    parser.add_argument("--json", action="store_true", help="Print JSON.")


def tools_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tools", nargs="+", required=True, metavar="SOURCE", help="Tools folders or files to load.")
    parser.add_argument(
        "--format", choices=("openai", "mcp"), default="openai", help="Schema format (default openai)."
    )
    parser.add_argument(
        "--toolset",
        metavar="SPEC",
        help="Toolset in URL query syntax, e.g. 'category=Data&tool="
        "APIBank/apibank_account' (what /mcp?SPEC lists). Nothing chosen: every API.",
    )
    parser.add_argument("--category", nargs="+", help="Every API of these categories.")
    parser.add_argument("--tool", nargs="+", metavar="CATEGORY/TOOL", help="Every API of these tools.")
    parser.add_argument("--api", nargs="+", metavar="CATEGORY/TOOL/API", help="These APIs.")
    parser.add_argument(
        "--query",
        nargs="+",
        metavar="QUERY_ID",
        help="The api_list of these StableToolBench queries (the query file must be among --tools).",
    )
    parser.add_argument("--out", metavar="FILE", help="Write here instead of standard output.")


TOOLS_COMMANDS = [
    Command(
        "stats",
        "Count categories, tools and APIs; list unreadable files.",
        tools_stats_arguments,
        tools_stats,
        TOOLS_ERRORS,
    ),
    Command("show", "Print the doc of a tool, or of one of its APIs.", tools_show_arguments, tools_show, TOOLS_ERRORS),
    Command(
        "export",
        "Write the function schemas of a toolset (OpenAI function calling or MCP).",
        tools_export_arguments,
        tools_export,
        TOOLS_ERRORS,
    ),
]


# -------------------------------------------------------------------------------------------- main
# Each top-level command, by the module of the stage that registers it. A call builds the parser of its own stage
# only: importing every stage's commands costs more than the lighter commands themselves (`mirrorapi models list`
# took 0.9 s with all of them, 0.3 s with its own). `mirrorapi --help`, and a name not listed here (a command a
# stage added since), register every stage, so nothing is ever unreachable; tests/test_command_line.py checks the
# table against what the stages register.
STAGES = {
    "cache": "mirrorapi.serving.commands",
    "serve": "mirrorapi.serving.commands",
    "benchmark": "mirrorapi.evaluation.commands",
    "eval": "mirrorapi.evaluation.commands",
    "data": "mirrorapi.data.commands",
    "train": "mirrorapi.training.commands",
    "models": "mirrorapi.models.commands",
}


def make_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The `mirrorapi` parser, with the stages `argv` can reach (every stage when argv is None)."""
    parser = argparse.ArgumentParser(prog="mirrorapi", description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"mirrorapi {mirrorapi_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_group(sub, "tools", "Inspect tool documentation (ToolBench tools folders).", TOOLS_COMMANDS)
    first = argv[0] if argv else None
    if first == "tools":
        stages = []
    elif first in STAGES:
        stages = [STAGES[first]]
    else:
        stages = list(dict.fromkeys(STAGES.values()))
    for stage in stages:
        importlib.import_module(stage).register(sub)
    return parser


def main(argv: list[str] | None = None, prog: str = "mirrorapi") -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run_parsed(make_parser(argv), argv, prog)


if __name__ == "__main__":
    sys.exit(main())
