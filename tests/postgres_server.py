"""A throwaway PostgreSQL cluster for the tests and the benchmark: initdb into a temporary
directory, a server on a Unix socket there (no TCP unless asked for), stopped and removed
afterwards. Uses Debian's `postgresql` package (the test command installs it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

USER = "gpuagent"


def binary(name: str) -> Path | None:
    """The newest installed PostgreSQL's ``name`` (initdb, pg_ctl, psql)."""
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), key=lambda p: p.parts[-3])
    return found[-1] if found else None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class PostgresServer:
    root: Path
    port: int
    # Set when the server also listens on loopback TCP.
    tcp: bool = False

    def url(self, database: str = "postgres") -> str:
        """A libpq URL for ``database`` over the Unix socket."""
        return f"postgresql://{USER}@/{database}?host={self.root}&port={self.port}"

    def tcp_url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def run(self, sql: str, database: str = "postgres") -> list[str]:
        """``sql`` through psql; its output lines (unaligned, tuples only)."""
        psql = binary("psql") or Path("psql")
        proc = subprocess.run(
            [
                *(str(psql), "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1"),
                *("-h", str(self.root), "-p", str(self.port)),
                *("-U", USER, "-d", database, "-f", "-"),
            ],
            input=sql,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"psql failed: {proc.stderr}")
        return proc.stdout.splitlines()

    def count(self, table: str, database: str = "postgres") -> int:
        return int(self.run(f"SELECT COUNT(*) FROM {table};", database)[0])

    def create_database(self, name: str) -> str:
        """A fresh database; its Unix-socket URL."""
        self.run(f"CREATE DATABASE {name};")
        return self.url(name)


def available() -> bool:
    return binary("initdb") is not None and binary("pg_ctl") is not None


@contextlib.contextmanager
def throwaway_postgres(*, tcp: bool = False, fsync: bool = False) -> Iterator[PostgresServer]:
    """A running cluster whose superuser is ``gpuagent`` (trust authentication, only
    reachable by this host's users), gone afterwards."""
    initdb, pg_ctl = binary("initdb"), binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        raise FileNotFoundError("PostgreSQL's initdb and pg_ctl (Debian package postgresql)")
    root = Path(tempfile.mkdtemp(prefix="gpuagent-pg-"))
    as_owner: list[str] = []
    if os.geteuid() == 0:
        # PostgreSQL will not run as root: the throwaway cluster belongs to its own user.
        shutil.chown(root, "postgres")
        as_owner = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", free_port()
    listen = "127.0.0.1" if tcp else ""
    options = (
        f"-c listen_addresses='{listen}' -k {root} -p {port} -c fsync={'on' if fsync else 'off'}"
        " -c max_connections=200"
    )

    def ctl(*args: str) -> None:
        subprocess.run([*as_owner, *args], check=True, capture_output=True, timeout=120)

    ctl(str(initdb), "-D", str(data), "-A", "trust", "-U", USER, "-E", "UTF8", "--no-sync")
    ctl(str(pg_ctl), "-D", str(data), "-l", str(root / "log"), "-o", options, "-w", "start")
    try:
        yield PostgresServer(root, port, tcp)
    finally:
        subprocess.run(
            [*as_owner, str(pg_ctl), "-D", str(data), "-m", "immediate", "-w", "stop"],
            capture_output=True,
            check=False,
        )
        shutil.rmtree(root, ignore_errors=True)
