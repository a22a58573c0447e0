"""StableToolBench cache folders and real pairs in and out of any cache store.

StableToolBench's cache folder layout (notes §3) is `<cache>/<category>/<tool>_for_<category>/<api>.json`,
each file an object mapping the Python repr of an argument dict to `{"error", "response"}`.
`import_stabletoolbench_cache` reads it (repr keys map to canonical keys), `export_stabletoolbench_cache`
writes it back; `import_pairs` loads real pairs (our JSONL schema) with provenance `real`.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from mirrorapi.names import api_key_name, standardize, standardize_category
from mirrorapi.records import SourceError, canonical_json, read_pairs_jsonl, read_stabletoolbench_cache
from mirrorapi.serving.cache.entries import IMPORTED, REAL, RECORDED, CacheError
from mirrorapi.serving.cache.store import Store
from mirrorapi.tools import ToolRegistry, UnknownName
from mirrorapi.transport_failures import transport_failure

logger = logging.getLogger(__name__)


# StableToolBench's server cached its own failure placeholder; it is not a response, so it is not imported.
_PLACEHOLDERS = ("Failed to generate fake response",)


def _canonical_names(registry: ToolRegistry | None, category: str, tool: str, api: str) -> tuple[tuple, bool]:
    """(category, tool, api) as the server keys them: the registry's names when it knows the API."""
    if registry is not None:
        try:
            doc = registry.resolve(category, tool, api)
            return (doc.category, doc.tool, doc.api), True
        except UnknownName:
            pass
    return (standardize_category(category), standardize(tool), api_key_name(api)), False


def _fingerprint(folder: Path) -> str:
    """Changes when a file of the folder is added, removed or rewritten (cheap: stat only). The files are those the
    reader reads, `<category>/<tool>/<api>.json`, through symlinked folders as it goes (os.walk did not follow them:
    a changed folder behind a link was skipped as unchanged)."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*/*/*.json")):
        if path.is_file():
            st = path.stat()
            digest.update(f"{path.relative_to(folder)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _store(
    cache: Store, pairs: Iterable[dict], registry, provenance: str, report: dict, recorded: bool = False
) -> None:
    """`recorded`: the pairs were recorded from real APIs, so a transport failure among them (a rate limit, a
    timeout, a key the API refused on the day) is not stored: served from the cache it would answer that call with
    the outage forever, and shown as an example it would teach one. The data builder drops them too
    (`mirrorapi.simulator_pairs`), as StableToolBench's server never caches such a real answer (its
    `check_result`): the call is simulated instead."""
    rows, resolved = [], {}
    for pair in pairs:
        names = (pair["category"], pair["tool_name"], pair["api_name"])
        if names not in resolved:
            resolved[names] = _canonical_names(registry, *names)
            if not resolved[names][1]:
                report["unresolved_apis"] += 1
        response = pair["response"]
        if response["error"] in _PLACEHOLDERS:
            report["skipped_placeholders"] += 1
            continue
        failure = transport_failure(response["error"], response["response"]) if recorded else None
        if failure:
            skipped = report["skipped_transport_failures"]
            skipped[failure] = skipped.get(failure, 0) + 1
            continue
        rows.append((*resolved[names][0], pair["tool_input"], response["error"], response["response"]))
    report["entries"] += len(rows)
    report["stored"] += cache.put_many(rows, provenance)


def import_stabletoolbench_cache(
    cache: Store,
    folder: str | os.PathLike,
    registry: ToolRegistry | None = None,
    origin: str | None = None,
    force: bool = False,
) -> dict:
    """Load a StableToolBench cache folder with provenance `imported:<origin>` (default: the folder's name).

    Done once per folder: an unchanged folder (same files, sizes and times) is skipped unless
    `force`. With a `registry`, names are resolved as the server resolves requests. Entries never
    replace recorded ones already in the cache (they do replace simulated ones). Returns a report.
    """
    folder = Path(folder).resolve()
    if not folder.is_dir():
        raise CacheError(f"StableToolBench cache folder not found: {folder}")
    report: dict[str, Any] = {
        "origin": str(folder),
        "skipped": False,
        "entries": 0,
        "stored": 0,
        "unresolved_apis": 0,
        "skipped_placeholders": 0,
        "unreadable": [],
    }
    fingerprint = _fingerprint(folder)
    if not force and cache.import_fingerprint(str(folder)) == fingerprint:
        report["skipped"] = True
        logger.info("cache folder %s was imported before and has not changed: not imported again", folder)
        return report
    first_order: dict[tuple, str] = {}  # a call -> its arguments as its first key wrote them
    report["argument_orders_merged"] = 0

    def counted(pairs: Iterable[dict]) -> Iterator[dict]:
        # Keys of one call in another argument order are one entry here (the cache key is canonical; the first
        # order is the one written back): StableToolBench's server looks them up apart, so the report says so.
        for pair in pairs:
            call = (pair["category"], pair["tool_name"], pair["api_name"], canonical_json(pair["tool_input"]))
            written = json.dumps(pair["tool_input"], ensure_ascii=False)
            report["argument_orders_merged"] += first_order.setdefault(call, written) != written
            yield pair

    try:
        pairs = read_stabletoolbench_cache(folder, on_bad=report["unreadable"].append)
        _store(cache, counted(pairs), registry, IMPORTED + (origin or folder.name), report)
    except SourceError as exc:
        raise CacheError(str(exc)) from None
    if report["entries"] or not report["unreadable"]:  # one that read nothing it could is no import: a rerun tries
        cache.record_import(str(folder), fingerprint, report["entries"])  # again (it said "imported before")
    logger.info(
        "imported %s: %d entries (%d new), %d unreadable, %d placeholders skipped, %d APIs unknown "
        "to the tools folder",
        folder,
        report["entries"],
        report["stored"],
        len(report["unreadable"]),
        report["skipped_placeholders"],
        report["unresolved_apis"],
    )
    return report


def import_pairs(cache: Store, path: str | os.PathLike, registry: ToolRegistry | None = None) -> dict:
    """Load real pairs (our JSONL schema) with provenance `real`; the first pair of a key wins. Transport failures
    are left out (`_store`), counted by kind in the report's `skipped_transport_failures`."""
    report: dict[str, Any] = {
        "origin": str(path),
        "skipped": False,
        "entries": 0,
        "stored": 0,
        "unresolved_apis": 0,
        "skipped_placeholders": 0,
        "skipped_transport_failures": {},
        "unreadable": [],
    }
    try:
        pairs = read_pairs_jsonl(path, on_bad=report["unreadable"].append)
        _store(cache, pairs, registry, REAL, report, recorded=True)
    except SourceError as exc:
        raise CacheError(str(exc)) from None
    return report


def _write_json_atomically(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    # Made new, never opened as found: a `<api>.json.tmp` link left in the folder (planted, or by whoever shares it)
    # was followed, and the export overwrote the file it points to, outside the folder (audit of 2026-12-01).
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    descriptor = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    with open(descriptor, "w", encoding="utf-8") as fh:
        json.dump(data, fh, ensure_ascii=False, indent=4)
    os.replace(tmp, path)


def unsafe_name(name: str) -> str | None:
    """Why `name` cannot be a folder or file name of an export (None when it can): it must stay one
    path component inside the export folder, whatever a pairs file or a shared database holds."""
    if name in ("", ".", ".."):
        return f"{name!r} is not a file name"
    if "/" in name or "\\" in name:
        return f"{name[:80]!r} contains a path separator"
    if "\0" in name:
        return f"{name[:80]!r} contains a NUL character, which no file name may"
    # 255 bytes a name on Linux's file systems, less the ".tmp" an atomic write adds (was 200: ToolEnv2404 has an
    # API whose file is 248 bytes, which StableToolBench writes)
    if len(name.encode("utf-8")) > 255 - len(".tmp"):
        return f"{name[:40]!r}... is longer than a file name may be"
    return None


def export_identity(cache: Store, identity: str | None) -> str:
    """The simulator identity an export writes: the one named, or the only one the cache holds
    ('' when it holds no simulated answer). Several and none named is an error: answers of two
    simulators must not be mixed in one benchmark cache."""
    identities = cache.identities()
    if identity is not None:
        if identity and identity not in identities:
            known = ", ".join(identities) or "none"
            raise CacheError(
                f"no simulated answers of identity {identity!r} in {cache.location} (identities: {known})"
            )
        return identity
    if len(identities) > 1:
        raise CacheError(
            f"{cache.location} holds simulated answers of {len(identities)} simulator identities; name one "
            f"with --identity ({', '.join(identities)}), or '' for recorded answers only"
        )
    return next(iter(identities), RECORDED)


def export_stabletoolbench_cache(
    cache: Store, folder: str | os.PathLike, provenance: Iterable[str] = (), identity: str | None = None
) -> dict:
    """Write the cache as a StableToolBench cache folder: the recorded answers plus the simulated
    answers of one simulator identity (see `export_identity`), i.e. what a server of that identity
    answers; `provenance`: only entries whose provenance starts with one of these prefixes.

    Keys are `str(arguments)` with the arguments in the order they were first received, which is
    the key StableToolBench's server computes (`str(json.loads(tool_input))`). Files of the APIs
    written are replaced; other files are left alone. Names that would leave `folder` (`..`, a `/`,
    an absolute path) are refused: those APIs are listed in the report's `refused`, nothing is written
    for them."""
    provenance = list(provenance)
    if provenance and not any(p.startswith("simulated:") or "simulated:".startswith(p) for p in provenance):
        identity = RECORDED  # only recorded answers asked for: no simulator's answers to choose between
    identity = export_identity(cache, identity)
    rows = cache.served_entries(identity, provenance)
    root = Path(folder).resolve()
    files = entries = 0
    refused = []
    for (category, tool, api), group in itertools.groupby(rows, key=lambda row: row[:3]):
        # A call's rows come with its recorded answer last (`served_entries`), so it is the one written, as a
        # server answers: a simulated answer stored while an import of the call's recording was under way (two
        # PostgreSQL transactions cannot see each other's row) stays beside it in the store.
        content = {str(json.loads(row[3])): json.loads(row[4]) for row in group}
        # The folder StableToolBench's server reads: the client's tool name standardized (`prepare_tool_name_and_url`),
        # whatever the tools folder's file is called (ToolEyes' `API_BASKETBALL.json`).
        tool_folder = f"{standardize(tool)}_for_{category}"
        problem = next(filter(None, (unsafe_name(n) for n in (category, tool_folder, f"{api}.json"))), None)
        path = root / category / tool_folder / f"{api}.json"
        if problem is None and not path.resolve().is_relative_to(root):  # e.g. a symlink left in the folder
            problem = f"{path} resolves outside {root}"
        if problem is not None:
            refused.append(f"{category}/{tool}/{api} ({len(content)} entries): {problem}")
            logger.warning("export refused %s/%s/%s: %s", category, tool, api, problem)
            continue
        try:
            _write_json_atomically(path, content)
        except OSError as exc:  # the folder is a file, or cannot be made: the user's to fix, in one line
            raise CacheError(f"cannot write export folder {root}: {exc.strerror or exc} ({exc.filename})") from None
        files, entries = files + 1, entries + len(content)
    return {"folder": str(root), "identity": identity, "files": files, "entries": entries, "refused": refused}
