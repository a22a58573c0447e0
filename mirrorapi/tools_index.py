"""A compiled index of a ToolBench tools folder, so that a server starts without parsing 12,301 JSON files.

Reading ToolEnv2404 (135 MB of JSON) takes 2-5 s; the index holds only what `ToolRegistry` keeps of each
file, in one `marshal` file, and loads in a fraction of that (bench/registry.py prints both). It is kept
beside the folder (`<parent>/.<folder>.mirrorapi-index`), or, where that parent cannot be written or is
marked read-only (no write bit: a shared data set), in the user's cache folder
(`$XDG_CACHE_HOME/mirrorapi/tools-index/`, keyed by the folder's absolute path); with MIRRORAPI_TOOLS_INDEX_DIR set,
there and nowhere else.

An index is used only when it was written for exactly the folder as it is now: its fingerprint covers
every category folder's name and mtime and every tool file's name, size and mtime (a file edited in place
changes its own mtime; one added, removed or renamed changes its folder's; a folder changed in the last
SETTLE_SECONDS gets no index yet, see `fingerprint`), and the source of
`mirrorapi/tools.py` and of this module, so a change of what the registry keeps rebuilds it. Anything
else (a missing, stale, truncated, damaged or foreign file: the body's SHA-256 is written after the fingerprint and
checked at each load, ~25 ms for ToolEnv2404's 31 MB, where a flipped bit served other docs) means reading the
folder, then writing a new index;
failing to write one is logged, never fatal. Why marshal, not pickle: it holds plain data only (loading
it runs no code) and loads about as fast; not json: two to three times slower to load.
"""

from __future__ import annotations

import hashlib
import logging
import marshal
import os
import tempfile
import time
from pathlib import Path

logger = logging.getLogger(__name__)

MAGIC = b"mirrorapi-tools-index 2\n"  # 2: the body's digest after the fingerprint
SETTLE_SECONDS = 2.0
INDEX_DIR_ENV = "MIRRORAPI_TOOLS_INDEX_DIR"  # every index in this folder instead (the tests' own, a shared cache)
# What the registry reads of a tool file and of each of its APIs (mirrorapi.tools._add_tool_json/_add_api).
TOOL_KEYS = ("tool_name", "name", "tool_description")
API_KEYS = (
    "name",
    "api_name",
    "description",
    "api_description",
    "method",
    "required_parameters",
    "optional_parameters",
    "template_response",
    "schema",
)
_CODE = b"".join(Path(__file__).with_name(name).read_bytes() for name in ("tools.py", "tools_index.py"))


def scan(folder: Path) -> tuple[list[tuple[str, str, str, int, int, int]], list[tuple[str, str]]]:
    """(category folder name, file stem, path, size, mtime_ns, ctime_ns) of every `<Category>/<tool>.json`, in load
    order, and (path, reason) of each category folder that cannot be listed (its tools are left out, the others
    load). os.scandir, not glob: glob skips the dotfile `.json` that ToolEnv2404 really contains."""
    files, unlisted = [], []
    for category in sorted(os.scandir(folder), key=lambda e: e.name):
        if not category.is_dir():
            continue
        try:
            entries = sorted(os.scandir(category.path), key=lambda e: e.name)
        except OSError as exc:  # no permission to list it
            unlisted.append((category.path, f"{type(exc).__name__}: {exc.strerror or exc}"))
            continue
        for entry in entries:
            if entry.name.endswith(".json") and entry.is_file():
                stat = entry.stat()
                stem = entry.name[: -len(".json")]
                files.append((category.name, stem, entry.path, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns))
    return files, unlisted


def fingerprint(folder: Path, files: list[tuple[str, str, str, int, int, int]]) -> tuple[bytes, bool]:
    """(the folder's fingerprint, whether it is settled: nothing in it changed in the last SETTLE_SECONDS).
    An index is written only for a settled folder: a file's mtime ticks with the kernel's clock (a few
    milliseconds), so a file rewritten at the same size within the tick of the index would look unchanged.
    A file's ctime is in the fingerprint too: a `chmod` that made it readable, or an edit whose mtime was put back
    (`cp -p`, `touch -r`), changes only its ctime, and the index must go stale then as well."""
    digest = hashlib.sha256(_CODE)
    digest.update(str(folder.resolve()).encode())
    newest = 0
    for category in sorted({f[0] for f in files}):
        mtime = os.stat(folder / category).st_mtime_ns
        newest = max(newest, mtime)
        digest.update(b"%s\0%d\n" % (category.encode("utf-8", "surrogateescape"), mtime))
    for category, stem, _, size, mtime, ctime in files:
        newest = max(newest, mtime)
        digest.update(
            b"%s/%s\0%d\0%d\0%d\n"
            % (
                category.encode("utf-8", "surrogateescape"),
                stem.encode("utf-8", "surrogateescape"),
                size,
                mtime,
                ctime,
            )
        )
    return digest.digest(), time.time_ns() - newest > SETTLE_SECONDS * 1e9


def trimmed(data: dict) -> dict:
    """What the registry keeps of a tool file (the rest of ToolEnv2404's files is never read)."""
    out = {k: data[k] for k in TOOL_KEYS if k in data}
    api_list = data.get("api_list")
    if isinstance(api_list, list):
        out["api_list"] = [
            {k: api[k] for k in API_KEYS if k in api} if isinstance(api, dict) else api for api in api_list
        ]
    return out


def locations(folder: Path) -> list[Path]:
    """Where the index of `folder` may be: in $MIRRORAPI_TOOLS_INDEX_DIR when set (only there), else beside the
    folder, then in the user's cache folder."""
    folder = folder.resolve()
    key = hashlib.sha256(str(folder).encode()).hexdigest()[:16]
    name = f"{folder.name}-{key}.mirrorapi-index"
    if os.environ.get(INDEX_DIR_ENV):
        return [Path(os.environ[INDEX_DIR_ENV]).expanduser() / name]
    beside = [folder.parent / f".{folder.name}.mirrorapi-index"]
    try:
        cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    except RuntimeError:  # no HOME and no passwd entry (a container's --user): no cache folder, only beside it
        return beside
    return [*beside, cache_home / "mirrorapi" / "tools-index" / name]


def _writable(folder: Path) -> bool:
    """Whether we may write in `folder`: permitted, and not marked read-only (no write bit for anyone), which
    root, whom permissions do not stop, respects too."""
    return os.access(folder, os.W_OK) and bool(folder.stat().st_mode & 0o222)


def read(folder: Path, expected: bytes) -> tuple[list, list] | None:
    """(records, unreadable) of the index written for `expected`, or None (none, stale or unreadable)."""
    for path in locations(folder):
        try:
            with open(path, "rb") as fh:
                if fh.read(len(MAGIC)) != MAGIC or fh.read(len(expected)) != expected:
                    continue
                digest, body = fh.read(hashlib.sha256().digest_size), fh.read()
            if hashlib.sha256(body).digest() != digest:
                logger.info("tools index %s not used (damaged: its digest does not match)", path)
                continue
            records, unreadable = marshal.loads(body)
            return records, unreadable
        except FileNotFoundError:
            continue
        except (OSError, ValueError, EOFError, TypeError) as exc:  # truncated or foreign: rebuilt
            logger.info("tools index %s not used (%s)", path, exc)
    return None


def write(folder: Path, stamp: bytes, records: list, unreadable: list) -> Path | None:
    """Write the index beside the folder, else in the cache folder (atomically: a reader sees the whole
    file or none); the path written, or None when neither can be."""
    body = marshal.dumps((records, unreadable))
    data = MAGIC + stamp + hashlib.sha256(body).digest() + body
    for path in locations(folder):
        if path.parent.is_dir() and not _writable(path.parent):
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, temporary = tempfile.mkstemp(prefix=path.name, dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                os.chmod(temporary, 0o644)  # as readable as the folder's files (mkstemp's are the owner's only)
                os.replace(temporary, path)
            except BaseException:
                os.unlink(temporary)
                raise
            return path
        except (OSError, ValueError) as exc:  # read-only, full, or data marshal cannot hold: the next place
            logger.debug("tools index not written to %s: %s", path, exc)
    logger.warning("tools index of %s not written (no writable place): the next start reads the folder again", folder)
    return None
