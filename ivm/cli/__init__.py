"""The command line: ``ivm serve``, ``ivm sql``, ``ivm status``, ``ivm bench`` and the demo.

Entered through ``main`` (the ``ivm`` command, ``python -m ivm``).
"""


def main(argv: list[str] | None = None) -> int:
    """The ``ivm`` command (imported on call: modules of this package, such as serving.py,
    are imported by the server, which the command's module imports in turn)."""
    from ivm.cli.cli import main as run

    return run(argv)
