"""Spark's own file source reads an ``eo_files`` output on S3 through ``s3a://`` (hadoop-aws):
it lists the files through ``_spark_metadata``, as for Spark's own file sink. Prints one line
``ROWS <json list of [id, grp, payload]>``. The S3 settings come as ``--conf key=value``."""

from __future__ import annotations

import argparse
import json
import sys

from tests.helpers import spark_builder


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--path", required=True)
    p.add_argument("--conf", action="append", default=[])
    args = p.parse_args(argv)
    conf = dict(kv.split("=", 1) for kv in args.conf)
    spark = spark_builder("read-s3a", "local[1]", **conf).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    rows = spark.read.parquet(args.path).select("id", "grp", "payload").collect()
    print("ROWS " + json.dumps([[r.id, r.grp, r.payload] for r in rows]), flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
