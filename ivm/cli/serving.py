"""Where a running ``ivm serve`` listens, kept in its data directory.

    DIR/server.json   {"pid": ..., "flight": "grpc://HOST:PORT", "postgresql": ... or null,
                       "auth": true when clients need a token}

The server writes it once it listens and removes it when it stops. A
process that finds the directory locked (``ivm sql --data``, ``ivm status
--data``) reads it to tell the user which address to ``--connect`` to. A
file left by a server that was killed names a process that no longer runs
and is ignored.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

FILE = "server.json"


def record(data_dir: str | os.PathLike, flight: str, postgresql: str | None, auth: bool) -> None:
    path = Path(data_dir) / FILE
    temporary = path.with_name(FILE + ".tmp")
    temporary.write_text(json.dumps({"pid": os.getpid(), "flight": flight, "postgresql": postgresql,
                                     "auth": auth}))
    os.replace(temporary, path)  # readers never see half a file


def forget(data_dir: str | os.PathLike) -> None:
    try:
        (Path(data_dir) / FILE).unlink()
    except FileNotFoundError:
        pass


def recorded(data_dir: str | os.PathLike) -> dict | None:
    """What the server serving ``data_dir`` recorded; None when none is known to run."""
    try:
        found = json.loads((Path(data_dir) / FILE).read_text())
        os.kill(int(found["pid"]), 0)  # signal 0: does the process exist?
    except ProcessLookupError:
        return None
    except PermissionError:  # it exists, run by another user
        return found
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return found


def connect_hint(data_dir: str | os.PathLike, command: str) -> str:
    """What to run instead, for a database that another process holds."""
    found = recorded(data_dir)
    if found is None:
        return (f"if ivm serve holds it, run {command} --connect with the server's address "
                "(e.g. grpc://127.0.0.1:8815)")
    token = " --auth-token TOKEN" if found.get("auth") else ""
    return f"ivm serve (pid {found['pid']}) holds it: run {command} --connect {found['flight']}{token}"
