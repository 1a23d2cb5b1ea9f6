"""The Arrow Flight SQL server over ``ivm.Database`` (``ivm serve``; see server.py)."""
