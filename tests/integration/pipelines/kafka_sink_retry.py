"""Task retries inside one Spark application, for the ``eo_kafka`` sink.

Runs on ``local[2,4]`` (4 attempts per task). The test arms, once across processes
(``CONNECTORS_FAILPOINTS_ONCE_DIR``), ``kafka_sink.mid_produce@<b>#<n>!raise``: the first
attempt of one task flushes ``n`` records (half its rows) and raises; Spark retries the task,
whose attempt finds the started marker, scans and skips what the failed attempt wrote.

Writes batch 1 with a plain sink (foreachBatch-style ``sink.write``), batch 2 through the
DataSource batch writer with ``transactional=true`` and batch 3 with a transactional
``sink.write`` (the test arms ``kafka_sink.after_txn_commit@3!raise`` there: a task that
fails after its transaction committed); prints each batch's commit record as
``COMMIT <json>``, and at the end what its metrics endpoint (``connectors.monitoring.serve``)
shows of each sink as ``METRICS <json>``: ``{sink_id: {metric: value}}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request

from tests.integration.pipelines.common import pipeline_spark


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic-plain", required=True)
    p.add_argument("--topic-txn", required=True)
    p.add_argument("--topic-txn-after", required=True)
    p.add_argument("--wal", required=True)
    p.add_argument("--rows", type=int, default=4000)
    args = p.parse_args(argv)

    spark = pipeline_spark("kafka-sink-retry", "local[2,4]", "ERROR")
    from connectors import monitoring
    from connectors.kafka.sink import KafkaSink

    server = monitoring.serve(spark, port=0)

    df = spark.range(0, args.rows, numPartitions=2).selectExpr(
        "cast(id % 1000 as string) as key", "concat('row-', cast(id as string)) as value"
    )
    plain = KafkaSink("retry-plain", args.wal + "/plain", bootstrap_servers=args.bootstrap,
                      topic=args.topic_plain)
    plain.write(df, 1)
    print("COMMIT", json.dumps(plain.commit_info(1)), flush=True)

    (
        df.write.format("eo_kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("topic", args.topic_txn)
        .option("sink_id", "retry-txn")
        .option("walPath", args.wal + "/txn")
        .option("transactional", "true")
        .option("batchId", 2)
        .mode("append")
        .save()
    )
    txn = KafkaSink("retry-txn", args.wal + "/txn", bootstrap_servers=args.bootstrap,
                    topic=args.topic_txn)
    print("COMMIT", json.dumps(txn.commit_info(2)), flush=True)

    after = KafkaSink("retry-txn-after", args.wal + "/txn-after",
                      bootstrap_servers=args.bootstrap, topic=args.topic_txn_after,
                      transactional=True)
    after.write(df, 3)
    print("COMMIT", json.dumps(after.commit_info(3)), flush=True)
    print("METRICS", json.dumps(sink_metrics(server.url)), flush=True)
    server.stop()
    spark.stop()
    return 0


def sink_metrics(url: str) -> dict[str, dict[str, float]]:
    """One scrape of the endpoint: every ``eo_sink_*`` counter sample, by sink_id."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - our own endpoint
        text = r.read().decode()
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("eo_sink_") and sample.name.endswith("_total"):
                out.setdefault(sample.labels["sink_id"], {})[sample.name] = sample.value
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
