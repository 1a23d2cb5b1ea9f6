"""Tests of ivm/ingest/."""
