"""Tests of ivm/execute/ (compiled steps, DuckDB, Spark)."""
