"""``python -m ivm ...``: the same as the ``ivm`` command."""

import sys

from ivm.cli import main

sys.exit(main())
