"""The `mirrorapi` command: `mirrorapi tools ...` (and more subcommands as the stack grows).

Errors a user can fix (a missing folder, an unknown name) print one line and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

from mirrorapi.tools import RegistryError, ToolRegistry, UnknownName


def _print_json(obj) -> None:
    print(json.dumps(obj, ensure_ascii=False, indent=2, default=str))


# ------------------------------------------------------------------------------------------- tools
def tools_stats(args: argparse.Namespace) -> int:
    registry = ToolRegistry.load(args.sources)
    stats = registry.stats()
    if args.json:
        _print_json(stats)
        return 0
    print(f"categories:   {stats['categories']:,}")
    print(f"tools:        {stats['tools']:,}")
    print(f"APIs:         {stats['apis']:,} ({stats['apis_with_response_schema']:,} with a response schema)")
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
        _print_json([d.to_dict() for d in docs] if args.api is None else docs[0].to_dict())
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


def add_tools_parser(sub) -> None:
    tools = sub.add_parser("tools", help="Inspect tool documentation (ToolBench tools folders).")
    tsub = tools.add_subparsers(dest="tools_command", required=True)
    stats = tsub.add_parser("stats", help="Count categories, tools and APIs; list unreadable files.")
    stats.add_argument("sources", nargs="+", help="Tools folders, StableToolBench query files or OpenAI function files.")
    stats.add_argument("--json", action="store_true", help="Print one JSON object.")
    stats.set_defaults(func=tools_stats)
    show = tsub.add_parser("show", help="Print the doc of a tool, or of one of its APIs.")
    show.add_argument("category")
    show.add_argument("tool", help="Tool name as clients send it (`theclique`, `theclique_for_Data`).")
    show.add_argument("api", nargs="?", help="API name as clients send it (`transfermarkt_search`).")
    show.add_argument("--tools", nargs="+", required=True, metavar="SOURCE", help="Tools folders or files to load.")
    show.add_argument("--json", action="store_true", help="Print JSON.")
    show.set_defaults(func=tools_show)


# -------------------------------------------------------------------------------------------- main
def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mirrorapi", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_tools_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        return args.func(args)
    except (RegistryError, UnknownName) as exc:
        print(f"mirrorapi: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
