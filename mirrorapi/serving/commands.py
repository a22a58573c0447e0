"""The serving stage's commands: `mirrorapi serve` (what serving/main_mirrorapi.py runs alone) and
`mirrorapi cache import | export | prune | stats | migrate`.

Every --cache takes the SQLite file (PATH or sqlite:///PATH) or a postgresql://USER:PASSWORD@HOST:PORT/DB URL.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from mirrorapi.command_line import Command, add_command, add_group, print_json
from mirrorapi.serving.cache import CacheError
from mirrorapi.serving.config import ConfigError, add_server_arguments
from mirrorapi.tools import RegistryError, ToolRegistry, UnknownName

STARTUP_ERRORS = (ConfigError, RegistryError, CacheError)  # a user's mistake: one line, exit status 2
CACHE_ERRORS = (CacheError, RegistryError, UnknownName)


# ------------------------------------------------------------------------------------------- serve
def serve(args: argparse.Namespace) -> int:
    from mirrorapi.serving.app import serve as run_server
    from mirrorapi.serving.config import settings_from_args

    run_server(settings_from_args(args))
    return 0


SERVE = Command(
    "serve",
    "Run the virtual API server (same as serving/main_mirrorapi.py).",
    add_server_arguments,
    serve,
    STARTUP_ERRORS,
)


# ------------------------------------------------------------------------------------------- cache
def cache_import_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="<cache>/<cat>/<tool>_for_<cat>/<api>.json folder, or a pairs .jsonl file.")
    parser.add_argument(
        "--cache",
        required=True,
        help=(
            "The cache: a SQLite file (created if missing) or a postgresql:// URL (its tables are created if missing)."
        ),
    )
    parser.add_argument("--tools", nargs="+", metavar="SOURCE", help="Resolve names with these tools folders.")
    parser.add_argument("--origin", help="Provenance suffix imported:<origin> (default: the folder's name).")
    parser.add_argument("--force", action="store_true", help="Import again even if the folder is unchanged.")
    parser.add_argument("--json", action="store_true", help="Print the report as JSON.")


def cache_import(args: argparse.Namespace) -> int:
    from mirrorapi.serving.cache import import_pairs, import_stabletoolbench_cache, open_cache

    registry = ToolRegistry.load(args.tools) if args.tools else None
    pairs = args.source.endswith(".jsonl")
    # Before the cache is opened: a mistyped source leaves no new database.
    if not Path(args.source).exists():
        raise CacheError(f"{'pairs file' if pairs else 'StableToolBench cache folder'} not found: {args.source}")
    if not pairs and not Path(args.source).is_dir():
        raise CacheError(f"{args.source} is a file: give a StableToolBench cache folder or a pairs .jsonl file")
    if pairs and (args.origin or args.force):  # what they name is a folder's import
        raise CacheError("--origin and --force are for a StableToolBench cache folder, not a pairs .jsonl file")
    cache = open_cache(args.cache)
    try:
        if args.source.endswith(".jsonl"):
            report = import_pairs(cache, args.source, registry=registry)
        else:
            report = import_stabletoolbench_cache(
                cache, args.source, registry=registry, origin=args.origin, force=args.force
            )
    finally:
        cache.close()
    if not report.get("skipped") and not report["entries"] and report["unreadable"]:  # e.g. a judge file as pairs
        raise CacheError(
            f"{args.source}: nothing read, {len(report['unreadable']):,} unreadable, e.g. {report['unreadable'][0]}"
        )
    if args.json:
        print_json(report)
    elif report["skipped"]:
        print(f"{report['origin']}: imported before and unchanged, nothing done (--force imports it again)")
    else:
        print(
            f"{report['origin']}: {report['entries']:,} entries read, {report['stored']:,} stored, "
            f"{len(report['unreadable']):,} unreadable, {report['skipped_placeholders']:,} failure placeholders "
            f"skipped"
            + (f", {report['unresolved_apis']:,} APIs not in the tools" if registry else "")
            + (
                f", {sum(transport.values()):,} transport failures skipped ("
                + ", ".join(f"{kind} {count:,}" for kind, count in sorted(transport.items()))
                + ")"
                if (transport := report.get("skipped_transport_failures"))
                else ""
            )
            + (
                f", {report['argument_orders_merged']:,} keys of a call already read, in another argument order, "
                "merged into it"
                if report.get("argument_orders_merged")
                else ""
            )
        )
        for reason in report["unreadable"][:20]:
            print(f"  {reason}")
    return 0


def cache_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder")
    parser.add_argument("--cache", required=True, help="The cache: a SQLite file or a postgresql:// URL.")
    parser.add_argument(
        "--provenance",
        nargs="+",
        metavar="PREFIX",
        help="Only entries whose provenance starts so (real, imported, simulated).",
    )
    parser.add_argument(
        "--identity",
        metavar="IDENTITY",
        help=(
            "Write the recorded answers and the simulated answers of this simulator identity (`cache stats` lists "
            "them; '' for recorded answers only). Needed when the cache holds several."
        ),
    )


def cache_export(args: argparse.Namespace) -> int:
    from mirrorapi.serving.cache import export_stabletoolbench_cache

    cache = _existing_cache(args.cache)
    try:
        report = export_stabletoolbench_cache(
            cache, args.folder, provenance=args.provenance or (), identity=args.identity
        )
    finally:
        cache.close()
    simulated = f" (simulated answers of {report['identity']})" if report["identity"] else ""
    print(f"{report['entries']:,} entries written to {report['files']:,} files under {report['folder']}{simulated}")
    for reason in report["refused"]:
        print(f"refused, no file can be written for it: {reason}", file=sys.stderr)
    return 1 if report["refused"] else 0


def cache_prune_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache", required=True, help="The cache: a SQLite file or a postgresql:// URL.")
    parser.add_argument("--identity", required=True, help="The simulator identity (as `cache stats` prints it).")


def cache_prune(args: argparse.Namespace) -> int:
    from mirrorapi.serving.cache import CacheError

    cache = _existing_cache(args.cache)
    try:
        deleted = cache.prune(args.identity)
        if not deleted:
            known = "; ".join(cache.identities()) or "none"
            raise CacheError(
                f"no simulated answers of identity {args.identity!r} in {cache.location} (identities: {known})"
            )
    finally:
        cache.close()
    print(f"{deleted:,} simulated answers of {args.identity} deleted from {cache.location}")
    return 0


def cache_migrate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="CACHE",
        help="The cache to copy: a SQLite file (PATH or sqlite:///PATH) or a postgresql:// URL.",
    )
    parser.add_argument(
        "--to",
        dest="destination",
        required=True,
        metavar="CACHE",
        help="The cache to copy into (created if missing): a SQLite file or a postgresql:// URL.",
    )
    parser.add_argument("--json", action="store_true", help="Print the report as JSON.")


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
        print_json(report)
    else:
        print(
            f"{report['entries_copied']:,} of {report['entries_read']:,} entries and {report['sessions_copied']:,} "
            f"sessions copied from {report['from']} to {report['to']} (entries it held already were kept)"
        )
    return 0


def cache_stats_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache", required=True, help="The cache: a SQLite file or a postgresql:// URL.")
    parser.add_argument("--json", action="store_true", help="Print one JSON object.")


def cache_stats(args: argparse.Namespace) -> int:
    cache = _existing_cache(args.cache)
    try:
        stats = cache.stats()
    finally:
        cache.close()
    if args.json:
        print_json(stats)
        return 0
    print(f"cache:      {stats['path']} ({stats['bytes'] / 1e6:.1f} MB, schema version {stats['schema_version']})")
    print(f"entries:    {stats['entries']:,} over {stats['apis']:,} APIs ({stats['errors']:,} errors)")
    print(f"hits:       {stats['hits']:,}")
    print(f"recorded:   {stats['recorded']:,} (shared by every simulator)")
    for provenance, n in sorted(stats["by_provenance"].items()):
        if not provenance.startswith("simulated:"):
            print(f"  {provenance}: {n:,}")
    print(
        f"simulated:  {stats['entries'] - stats['recorded']:,} in {len(stats['by_identity']):,} simulator identities"
    )
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


CACHE_COMMANDS = [
    Command(
        "import",
        "Import a StableToolBench cache folder, or real pairs (.jsonl).",
        cache_import_arguments,
        cache_import,
        CACHE_ERRORS,
    ),
    Command(
        "export",
        "Write the cache as a StableToolBench cache folder.",
        cache_export_arguments,
        cache_export,
        CACHE_ERRORS,
    ),
    Command(
        "prune",
        "Delete the simulated answers of one simulator identity.",
        cache_prune_arguments,
        cache_prune,
        CACHE_ERRORS,
    ),
    Command(
        "stats",
        "Entries, APIs, hits, simulator identities and imports of a cache.",
        cache_stats_arguments,
        cache_stats,
        CACHE_ERRORS,
    ),
    Command(
        "migrate",
        "Copy every entry, session and import record of one cache into another, e.g. a SQLite "
        "file into PostgreSQL (what the destination holds already is kept; run again after an interruption).",
        cache_migrate_arguments,
        cache_migrate,
        CACHE_ERRORS,
    ),
]


def register(sub) -> None:
    """The serving stage's subcommands of `mirrorapi`."""
    add_group(sub, "cache", "Import, export and inspect the response cache (SQLite or PostgreSQL).", CACHE_COMMANDS)
    add_command(sub, SERVE)
