"""Spark as a second compute engine for the same delta programs.

    session.py   the one SparkSession of the process (lazy, configured from settings)
    dialect.py   a program's sqlglot trees -> Spark SQL: the named rewrites where
                 DuckDB and Spark differ, UnsupportedError for what cannot render
    frames.py    stored relations as Spark DataFrames (cached per immutable run)
    temps.py     a run's temporaries: lazy DataFrames until the driver needs rows
    executor.py  SparkExecutor: runs a Program's queries as Spark jobs (chains as one)

Nothing here changes how results are committed: the executor returns the
same RowChanges as the DuckDB executor, and the engine commits and publishes
them exactly as it does for DuckDB.
"""
