"""Ingest: a change batch checked, cast and converted to a Z-set change of its table (-old +new rows).

A batch enters through ``Engine.ingest`` (ivm/engine.py), which commits the batches waiting for the
write lock together (``group_commit.take_and_commit``); ``changes.ChangeApplier.apply`` converts one.
"""
