"""Execute: the runners of a view's delta program, step by step: compiled operators over Arrow and
numpy (compiled/), DuckDB statements (duck.py) and Spark (spark/).

A program enters through ``executor.Executor.run``.
"""
