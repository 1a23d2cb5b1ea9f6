"""The errors ivm raises (defined in the frontend, the lowest layer)."""

from sql_frontend.errors import *  # noqa: F401,F403
from sql_frontend.errors import __doc__ as _doc  # noqa: F401
