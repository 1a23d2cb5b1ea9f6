"""A throwaway PostgreSQL server for tests and benchmarks: Debian's ``postgresql`` package,
``initdb`` in a temporary directory, ``wal_level=logical``, listening only on a
unix socket in that directory (no TCP at all). As root, the server runs as the
``postgres`` user (PostgreSQL refuses to run as root). Always stopped by ``stop``.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path


def bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise RuntimeError("PostgreSQL is not installed (./dev test installs Debian's postgresql package)")
    return Path(found[-1]).parent


class PostgresServer:
    def __init__(self, port: int = 5432):
        self.bin = bin_dir()
        self.root = Path(tempfile.mkdtemp(prefix="ivmpg-"))
        self.data = self.root / "data"
        self.port = port
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")
        options = (f"-c wal_level=logical -c listen_addresses='' -c unix_socket_directories={self.root} "
                   f"-c port={port} -c max_replication_slots=10 -c max_wal_senders=10 -c fsync=off "
                   "-c full_page_writes=off -c max_connections=30 -c TimeZone=UTC")
        self._run("pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.root / "server.log"), "-w",
                  "-t", "60", "start")
        self.dsn = f"host={self.root} port={port} user=postgres dbname=postgres"

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin / tool), *args]
        if self.user:
            command = ["runuser", "-u", self.user, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = self.root / "server.log"
            raise RuntimeError(f"{tool} failed: {done.stderr}{log.read_text() if log.exists() else ''}")

    def stop(self) -> None:
        if self.data.exists():
            try:
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "60", "stop")
            finally:
                shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "PostgresServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def server_log(server: PostgresServer, lines: int = 30) -> str:
    path = server.root / "server.log"
    return "\n".join(path.read_text().splitlines()[-lines:]) if path.exists() else ""
