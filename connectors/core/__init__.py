"""Spark-free building blocks: options, errors, storage, the WAL, failpoints, the sink protocol."""
