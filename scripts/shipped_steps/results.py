"""What a stage of `scripts/train_shipped_models.py` hands back (`--out`), checked against what a lent machine
returns from `$OUT`: at most 8 files, 16 MiB each, 64 MiB together."""

from __future__ import annotations

from pathlib import Path

from shipped_steps.common import log

MAX_FILES = 8
MAX_FILE_BYTES = 16 * 2**20
MAX_TOTAL_BYTES = 64 * 2**20


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []


def size_text(size: int) -> str:
    return f"{size / 2**20:.1f} MiB" if size >= 2**20 else f"{size / 2**10:.1f} KiB"


def limit_problem(root: Path) -> str | None:
    """What would stop a lent machine handing back `root` whole, or None."""
    files = files_under(root)
    total = sum(p.stat().st_size for p in files)
    big = [f"{p.relative_to(root)} {size_text(p.stat().st_size)}" for p in files if p.stat().st_size > MAX_FILE_BYTES]
    problems = []
    if len(files) > MAX_FILES:
        problems.append(f"{len(files)} files")
    if big:
        problems.append(f"over 16 MiB: {', '.join(big)}")
    if total > MAX_TOTAL_BYTES:
        problems.append(f"{size_text(total)} in all")
    if not problems:
        return None
    return (
        f"WARNING: {root} holds {'; '.join(problems)}: a lent machine hands back at most {MAX_FILES} files, 16 MiB "
        "each, 64 MiB in all"
    )


class Results:
    """A stage's output folder; each landing of a result checks the limits and warns once per new problem."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.warned: set[str] = set()
        out.mkdir(parents=True, exist_ok=True)

    def landed(self) -> None:
        """Call after writing into `out`."""
        problem = limit_problem(self.out)
        if problem and problem not in self.warned:
            self.warned.add(problem)
            log(problem)
