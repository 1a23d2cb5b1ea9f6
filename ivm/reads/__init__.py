"""Reads: SQL over one published snapshot, point reads, change feeds, EXPLAIN, status and the
PostgreSQL catalog relations.

A read enters through ``reads.Reader.query``.
"""
