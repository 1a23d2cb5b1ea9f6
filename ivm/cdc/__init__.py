"""CDC sources: Debezium change events (debezium.py) and PostgreSQL logical
replication with an initial snapshot (postgres.py, pgoutput.py).

Both turn upstream changes into ``__op`` batches (design.md) and apply them
with ``Database.apply_changes(table, batch, source=..., seq=...)``: the
upstream position (Debezium's source.sequence/lsn/ts_ms, PostgreSQL's commit
LSN) is the idempotent producer's ``seq``, so a re-delivery after a restart
is applied once.
"""
