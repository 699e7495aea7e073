"""What the storage fault tests (tests/integration/test_storage_faults_disk.py, _hdfs.py and
_s3.py) share: the topic they stream, the streaming query that carries it through the store under
test, and the truth checks of its output and of the source's WAL."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from connectors.core.wal import WriteAheadLog
from connectors.files.sink import FileSink
from tests.helpers import assert_exact, wait_for

#: Records in the topic (2 partitions), and per micro-batch: 16 batches, as many as the
#: longest test's phases need with a few to spare (every batch past them repeats a steady one).
N = 320
PER_BATCH = 20


def topic_records() -> list[tuple[bytes, bytes, int]]:
    """``(key, value, partition)``: ids 0..N-1 as keys, ``value-<id>`` as values."""
    return [(str(i).encode(), f"value-{i}".encode(), i % 2) for i in range(N)]


def rows(start: int, n: int, payload: Callable[[int], str] = "value-{}".format
         ) -> pa.RecordBatch:
    """``id`` and ``payload`` rows, as the file sink stages them outside Spark."""
    ids = list(range(start, start + n))
    return pa.record_batch({"id": pa.array(ids, pa.int64()),
                            "payload": pa.array([payload(i) for i in ids])})


class FaultQuery:
    """``eo_kafka`` (``walPath`` = ``root/wal``) -> ``eo_files`` (``path`` = ``root/out``),
    the checkpoint local; ``storage`` (e.g. ``retryTimeout``, an endpoint) set on both as
    ``storage.<key>``; ``read_options`` what this process needs to read the sink's state."""

    def __init__(self, spark: Any, bootstrap: str, topic: str, root: str, checkpoint: str,
                 sink_id: str, storage: Mapping[str, str],
                 read_options: Mapping[str, Any] | None = None) -> None:
        self.spark, self.bootstrap, self.topic = spark, bootstrap, topic
        self.wal, self.out, self.checkpoint = root + "/wal", root + "/out", checkpoint
        self.sink_id, self.storage, self.read_options = sink_id, dict(storage), read_options
        self.query: Any = None

    def start(self) -> FaultQuery:
        reader = (self.spark.readStream.format("eo_kafka")
                  .option("kafka.bootstrap.servers", self.bootstrap)
                  .option("subscribe", self.topic).option("startingOffsets", "earliest")
                  .option("maxOffsetsPerTrigger", PER_BATCH).option("walPath", self.wal))
        for k, v in self.storage.items():
            reader = reader.option(f"storage.{k}", v)
        out = reader.load().selectExpr("cast(cast(key as string) as bigint) as id",
                                       "cast(value as string) as payload")
        writer = (out.writeStream.format("eo_files").option("path", self.out)
                  .option("sink_id", self.sink_id)
                  .option("checkpointLocation", self.checkpoint)
                  .trigger(processingTime="200 milliseconds"))
        for k, v in self.storage.items():
            writer = writer.option(f"storage.{k}", v)
        self.query = writer.start()
        return self

    def committed(self) -> int:
        """The sink's last committed batch, -1 for none or while the store cannot answer."""
        try:
            last = FileSink(self.out, storage_options=self.read_options).last_committed()
        except Exception:  # noqa: BLE001 - the store down or full: no progress to see
            return -1
        return -1 if last is None else last

    def assert_up(self) -> None:
        error = self.query.exception()
        assert error is None and self.query.isActive, f"the query terminated: {error}"

    def progresses(self, batches: int = 2, timeout: float = 180) -> None:
        """``batches`` more commits within ``timeout``, the query up all along."""
        start = max(self.committed(), 0)

        def moved() -> bool:
            self.assert_up()
            return self.committed() >= start + batches

        wait_for(moved, timeout, what=f"{batches} more commits")

    def stop(self) -> None:
        if self.query is not None and self.query.isActive:
            self.query.stop()


def assert_output_exact(table: pa.Table) -> None:
    """The file sink's output holds every record of the topic once."""
    assert_exact(zip(table.column("id").to_pylist(), table.column("payload").to_pylist(),
                     strict=True),
                 [(i, f"value-{i}") for i in range(N)], what="the file sink's output")


def assert_wal_reaches_the_end(wal: WriteAheadLog) -> list[Any]:
    """Every window record of the source's WAL reads back, the last one ending at the
    topic's end; returns the records in order."""
    records = [wal.get(seq) for seq in wal.seqs()]
    assert records and all(r is not None for r in records)
    end = records[-1]["end"]  # type: ignore[index]
    assert sum(int(o) for p in end.values() for o in p.values()) == N, end
    return records
