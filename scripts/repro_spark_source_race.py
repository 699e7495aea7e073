"""Spark's own race, without this package: streaming queries that start at once on one
registered Python data source can fail their first tasks with ``java.io.OptionalDataException``
in ``HashMap.readObject`` (docs/deploying.md, "Starting many queries at once").

Every function Spark makes from a registered Python data source shares the registration's
``envVars`` (one ``java.util.HashMap``), and ``PythonStreamingSourceRunner.init`` puts three
keys into it from each starting query's own thread. The first puts resize the map; done by two
threads at once they can corrupt it, and a task serialized from a corrupted map has a stream
its executor cannot read.

Each round registers a trivial streaming source (a counter, nothing else) under a new name,
so its map is new, starts ``--queries`` queries on it at once into the ``noop`` sink with
``availableNow``, and counts the queries that failed. ``--settle`` puts the three keys into
the map right after registering, as ``connectors.register`` does: the puts at query start
then only replace values.

    python scripts/repro_spark_source_race.py --rounds 30 --queries 8
    python scripts/repro_spark_source_race.py --rounds 30 --queries 8 --settle

Measured 2026-11-28 (2 cores, pyspark 4.3.0): 25 rounds of 4 and 30 rounds of 8 without
``--settle``, 0 of 340 queries failed: the race was not caught this way yet.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition


class CounterReader(DataSourceStreamReader):
    def initialOffset(self) -> dict:
        return {"n": 0}

    def latestOffset(self) -> dict:
        return {"n": 10}

    def partitions(self, start: dict, end: dict) -> list:
        return [InputPartition(i) for i in range(start["n"], end["n"])]

    def read(self, partition: InputPartition):  # noqa: ANN201 - Spark's signature
        yield (partition.value,)

    def commit(self, end: dict) -> None:
        pass


def source(name: str) -> type[DataSource]:
    class Counter(DataSource):
        @classmethod
        def name(cls) -> str:
            return name

        def schema(self) -> str:
            return "n int"

        def streamReader(self, schema):  # noqa: ANN001, ANN201 - Spark's signature
            return CounterReader()

    return Counter


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--queries", type=int, default=8)
    p.add_argument("--settle", action="store_true")
    args = p.parse_args(argv)
    # The Python workers run this interpreter (with pyarrow), not whatever python3 is first
    # on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").appName("python-source-race")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    failed, errors = 0, set()
    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="python-source-race-")
    for r in range(args.rounds):
        name = f"counter{r}"
        spark.dataSource.register(source(name))
        if args.settle:
            env = (spark._jsparkSession.sessionState().dataSourceManager()
                   .lookupDataSource(name).dataSourceCls().envVars())
            for key, value in (("SPARK_LOCAL_DIRS", work), ("SPARK_AUTH_SOCKET_TIMEOUT", "15"),
                               ("SPARK_BUFFER_SIZE", "65536")):
                if not env.containsKey(key):
                    env.put(key, value)
        queries = [spark.readStream.format(name).load().repartition(2)
                   .writeStream.format("noop").trigger(availableNow=True)
                   .option("checkpointLocation", f"{work}/{r}-{q}").start()
                   for q in range(args.queries)]
        for q in queries:
            try:
                q.awaitTermination()
            except Exception as e:  # noqa: BLE001 - counted, whatever it is
                failed += 1
                text = str(e)
                errors.update(k for k in ("OptionalDataException", "StreamCorruptedException",
                                          "ConcurrentModificationException", "EOFException")
                              if k in text)
        print(f"round {r + 1}/{args.rounds}: {failed} queries failed so far", flush=True)
    print("RESULT " + json.dumps({"rounds": args.rounds, "queries": args.queries,
                                  "settle": args.settle, "failed_queries": failed,
                                  "errors": sorted(errors),
                                  "seconds": round(time.monotonic() - started, 1)}))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
