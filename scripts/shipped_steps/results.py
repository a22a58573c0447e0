"""What a stage of `scripts/train_shipped_models.py` hands back (`--out`, `--pack`), checked against what a lent
machine returns from `$OUT`: at most 8 files, 16 MiB each, 64 MiB together, counted over the whole `$OUT`, so
that several runs of one call are counted together."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

from shipped_steps.common import log

MAX_FILES = 8
MAX_FILE_BYTES = 16 * 2**20
MAX_TOTAL_BYTES = 64 * 2**20


def handed_back_root(path: Path) -> Path:
    """The folder whose files come back together: `$OUT` where it is set and holds `path`, else `path` itself."""
    out = os.environ.get("OUT")
    if out and path.resolve().is_relative_to(Path(out).resolve()):
        return Path(out)
    return path


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []


def size_text(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 2**10:.1f} KiB"


def limit_problem(root: Path, planned: int = 0) -> str | None:
    """What would stop a lent machine handing back `root` whole (with `planned` more files to come), or None."""
    files = files_under(root)
    total = sum(p.stat().st_size for p in files)
    big = [f"{p.relative_to(root)} {size_text(p.stat().st_size)}" for p in files if p.stat().st_size > MAX_FILE_BYTES]
    problems = []
    if len(files) + planned > MAX_FILES:
        problems.append(f"{len(files)} files" + (f" and {planned} to come" if planned else ""))
    if big:
        problems.append(f"over 16 MiB: {', '.join(big)}")
    if total > MAX_TOTAL_BYTES:
        problems.append(f"{size_text(total)} in all")
    if not problems:
        return None
    return (
        f"WARNING: {root} holds {'; '.join(problems)}: a lent machine hands back at most {MAX_FILES} files, 16 MiB "
        "each, 64 MiB in all (several runs of one call: --pack $OUT/NAME.tar each, docs/training.md)"
    )


class Results:
    """A stage's output folder, and with `--pack FILE` one tar of it, rewritten whole each time a result lands (so
    that what a killed run leaves is a complete archive of what it had); each landing checks the limits over the
    handed-back folder and warns once per new problem."""

    def __init__(self, out: Path, pack: str | None) -> None:
        self.out = out
        self.pack = Path(pack) if pack else None
        self.root = handed_back_root(self.pack.parent if self.pack else out)
        self.warned: set[str] = set()
        out.mkdir(parents=True, exist_ok=True)
        if self.pack:
            self.pack.parent.mkdir(parents=True, exist_ok=True)

    def landed(self, planned: int = 0) -> None:
        """Call after writing into `out` (`planned`: files still to come, for a warning before they are written)."""
        if self.pack:
            part = self.pack.with_name(self.pack.name + ".part")
            folder = self.pack.name.removesuffix(".tar")
            with tarfile.open(part, "w") as tar:
                for path in sorted(self.out.iterdir()):
                    if path.is_file():
                        tar.add(path, arcname=f"{folder}/{path.name}")
            os.replace(part, self.pack)
        self.warn(limit_problem(self.root, 0 if self.pack else planned))

    def warn(self, problem: str | None) -> None:
        if problem and problem not in self.warned:
            self.warned.add(problem)
            log(problem)

    def summary(self) -> list[str]:
        """The closing lines: where the results are, each file with its size, and a warning over the limits."""
        folder = self.pack.parent if self.pack else self.out
        shown = [self.pack] if self.pack and self.pack.is_file() else [] if self.pack else files_under(self.out)
        lines = [f"results: {self.pack or self.out}" + (f" (packed from {self.out})" if self.pack else "")]
        lines += [f"  {p.relative_to(folder)} {size_text(p.stat().st_size)}" for p in shown]
        problem = limit_problem(self.root)
        if problem:
            lines.append(problem)
        return lines

    def log_summary(self) -> None:
        for line in self.summary():
            log(line)
