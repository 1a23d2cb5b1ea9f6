"""PostgreSQL's wire protocol (v3) over ``ivm.Database``: psql, psycopg, asyncpg and BI tools connect.

The second door beside Arrow Flight SQL, on the same database and with the
same guarantees (every read sees every acknowledged write, on either door).

Why a codec of our own: ``riffq`` (Rust, the fast choice) ships no wheel for
this machine, and ``buenavista`` is a proxy framework built around its own
connection/session classes and a blocking per-request model that would wrap,
not reuse, our Database entry points and cancel machinery. The protocol
subset a database needs is small: ``messages.py`` is the codec, ``types.py``
the type OIDs and text/binary encodings, ``rows.py`` whole-result DataRow
assembly, ``parameters.py`` decoding bound values, ``auth.py`` SCRAM-SHA-256,
``errors.py`` SQLSTATEs, ``commands.py`` the statements answered here (SET,
SHOW, BEGIN), ``copy.py`` COPY's statement and formats, ``subscribe.py``
SUBSCRIBE's rows, ``dispatch.py`` what one statement does, ``session.py``
one connection's state machine and ``server.py`` the listener.
"""
