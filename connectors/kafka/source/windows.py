"""Batch windows over Kafka: exactly-once scheduled batch jobs (docs/kafka-source.md,
"Batch windows").

::

    from connectors import KafkaWindows, JdbcSink

    windows = KafkaWindows(spark, walPath="/data/wal/orders",
                           **{"kafka.bootstrap.servers": "k:9092", "subscribe": "orders"})
    with windows.next() as (window_id, df):      # None when there is nothing new
        sink.write(df.selectExpr(...), window_id) # batch_id = window_id
    # the window is committed here, because the block succeeded

Each window is a fixed set of offset ranges recorded in ``<walPath>/source`` *before* any
data is read. Until a window is committed, :meth:`KafkaWindows.next` hands out that same
window again, with exactly the same ranges, so a job that crashed half-way replays
precisely the data it had, and a sink keyed by ``window_id`` (``eo_jdbc``, ``eo_files``,
``eo_kafka``) writes it once. A new window ``[last end, latest)`` opens only after the
previous one was committed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from connectors.core.errors import KafkaSourceError
from connectors.core.options import RedactedDict, stringify_options
from connectors.kafka.source.options import KafkaSourceOptions
from connectors.kafka.source.planner import KafkaPlanner
from connectors.kafka.source.window_log import Window

log = logging.getLogger(__name__)


class KafkaWindow:
    """One window handed out by :class:`KafkaWindows`: ``window_id``, ``df``, offsets.

    As a context manager it commits on a clean exit and leaves the window uncommitted
    (to be replayed) when the block raises. It also unpacks as ``(window_id, df)``.
    """

    def __init__(self, owner: KafkaWindows, window: Window, df: Any) -> None:
        self._owner = owner
        self.window_id = window.window
        self.df = df
        # Spark's offset JSON, as the window WAL and ``wal show`` spell them.
        self.start: dict[str, Any] = owner.spec.encode(window.start)
        self.end: dict[str, Any] = owner.spec.encode(window.end)
        self.committed = False

    def __iter__(self) -> Iterator[Any]:
        return iter((self.window_id, self.df))

    def __enter__(self) -> KafkaWindow:
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        if exc_type is None:
            self.commit()

    def commit(self) -> None:
        """Mark the window committed, commit its end to the consumer group, purge old ones."""
        if not self.committed:
            self._owner.commit(self.window_id)
            self.committed = True

    def __repr__(self) -> str:
        return f"KafkaWindow({self.window_id}, start={self.start}, end={self.end})"


class KafkaWindows:
    """Reads Kafka as a sequence of replayable batch windows with ``spark.read``.

    Delivery: each window's rows are fixed by the WAL; combined with a sink that is
    idempotent per batch id (``batch_id = window_id``) every record is written exactly
    once, across crashes and reruns, as long as the same ``walPath`` is used and no two jobs
    run on it at the same time. Unit of parallelism: one Spark partition per Kafka
    partition range (``minPartitions``/``maxRecordsPerPartition`` split further; small
    ranges are grouped up to ``targetRecordsPerPartition`` records).

    ``options`` are the ``eo_kafka`` options (Python names may be given as keyword
    arguments, e.g. ``**{"kafka.bootstrap.servers": ...}, subscribe="t"``);
    ``startingOffsets`` (default earliest) applies to the first window only, and
    ``maxOffsetsPerTrigger``/``maxBytesPerTrigger`` cap the size of each window.
    """

    def __init__(self, spark: Any, walPath: str, **options: Any) -> None:  # noqa: N803
        self.spark = spark
        # repr() of the windows' options hides secrets (kafka.sasl.password, ...)
        self.options = RedactedDict(stringify_options(options))
        self.options["walPath"] = walPath
        for key in list(self.options):
            if key.lower() in ("endingoffsets", "eo.window"):
                raise KafkaSourceError(
                    f"KafkaWindows: option {key!r} is chosen per window; remove it"
                )
        self.spec = KafkaSourceOptions.from_options(self.options, batch=True)
        self.planner = KafkaPlanner(self.spec)
        self.planner.check_wal()

    def next(self) -> KafkaWindow | None:
        """The uncommitted window again, else a new one; None when nothing is new."""
        w = self.planner.next_window()
        if w is None:
            return None
        df = (
            self.spark.read.format("eo_kafka")
            .options(**self.options)
            .option("eo.window", str(w.window))
            .load()
        )
        return KafkaWindow(self, w, df)

    def __iter__(self) -> Iterator[KafkaWindow]:
        """Windows until the backlog is drained; each is committed when the loop body
        finishes without an exception (breaking out leaves the current one uncommitted)."""
        while True:
            w = self.next()
            if w is None:
                return
            yield w
            w.commit()

    def commit(self, window_id: int) -> None:
        """Mark ``window_id`` committed in the WAL and its end in the consumer group. Unlike
        a micro-batch's (planner step 2), the group commit is waited for: a window is a
        whole job, and a lag tool or ``startingOffsets=group`` read right after sees it (a
        failed group commit is logged, as there; the WAL holds the truth)."""
        w = self.planner.window(window_id)
        self.planner.commit(w.end, window=window_id)
        self.planner.clusters.settle_group_commit()
        log.info("KafkaWindows: window %d committed (end %s)", window_id,
                 self.spec.encode(w.end))

    def last_committed(self) -> int | None:
        wal = self.planner.wal
        return None if wal is None else wal.last_committed()

    def close(self) -> None:
        self.planner.close()
