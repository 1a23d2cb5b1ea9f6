"""The server under test: ``ivm serve`` from this checkout (see flight_server/process.py)."""

from flight_server.process import READY, ROOT, ServerProcess  # noqa: F401
