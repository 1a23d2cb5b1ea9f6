"""The errors ivm raises (defined in storage, the lowest layer)."""

from storage.errors import *  # noqa: F401,F403
from storage.errors import __doc__ as _doc  # noqa: F401
