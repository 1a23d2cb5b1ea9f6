"""Durable databases: each batch on disk (the change log) before it is acknowledged, then folded
into the views by the maintainer thread; checkpoints; conversion deferred to the fold.

A batch enters through ``durable.DurableEngine.ingest``; the fold through ``maintainer.Maintainer.fold``.
"""
