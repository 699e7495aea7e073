"""The ``eo_kafka`` source's planner: which offsets each window reads (docs/design.md,
"Kafka source").

This module knows Kafka but not Spark. ``connectors/spark/kafka_source.py`` adapts it to
PySpark's ``DataSourceStreamReader``/``DataSourceReader`` (and is the only place that
decodes and encodes Spark's offset JSON); ``connectors/kafka/source/windows.py`` builds the
batch-window API on it. Beside it: ``options`` (the parsed options), ``clusters``
(metadata, ListOffsets, group commits), ``window_log`` (the window WAL), ``offsets`` (pure
offset arithmetic) and ``range_reader`` (the executors' range reader).

Offsets here are always ``{(cluster, topic, partition): next_offset}``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from connectors.core import failpoints
from connectors.core.errors import KafkaSourceError
from connectors.core.secrets import redact_url
from connectors.kafka.source.clusters import Clusters
from connectors.kafka.source.offsets import (
    EARLIEST,
    LATEST,
    TP,
    OffsetRange,
    Offsets,
    group_ranges,
    limit_offsets,
    plan_ranges,
    records_for_bytes,
    report_data_loss,
    split_ranges,
    total_records,
    tp_name,
)
from connectors.kafka.source.options import (  # noqa: F401 - KafkaSourceOptions: public here too
    ClusterSpec,
    KafkaSourceOptions,
    StartSpec,
)
from connectors.kafka.source.window_log import Window, WindowLog
from connectors.monitoring import channel

log = logging.getLogger(__name__)

#: Times an end below its start is asked again before it is believed (data loss), and the
#: seconds between (:meth:`KafkaPlanner.confirm_behind`).
BEHIND_CONFIRMATIONS, BEHIND_INTERVAL = 3, 1.0

#: Windows kept in the WAL (``WriteAheadLog.retain``), for ``wal show`` and debugging.
WAL_KEEP_WINDOWS = 100


class KafkaPlanner:
    """Driver-side runtime of the source: starting offsets, admission control, the window
    WAL and commits.

    Picklable: its clients are created on first use and dropped when pickled, so the
    Spark reader that owns it can travel to executors without a live connection.
    """

    def __init__(self, opts: KafkaSourceOptions) -> None:
        self.opts = opts
        self.clusters = Clusters(opts)
        self.wal: WindowLog | None = (
            None if opts.wal_path is None
            else WindowLog(opts.wal_path, opts.multi_cluster, opts.storage))
        self._avg_record_bytes: float | None = None
        self._avg_samples = 0

    def close(self) -> None:
        self.clusters.close()

    def check_wal(self) -> None:
        """Driver, at start: the WAL's store enforces create-if-absent (probed once per
        store and process) and answers; one clear error before anything is planned."""
        if self.wal is not None:
            self.wal.check()

    def partitions(self) -> list[TP]:
        """The partitions every cluster's subscription matches now (sorted)."""
        return list(self.clusters.partitions())

    def latest(self, tps: list[TP]) -> Offsets:
        """High watermarks (the last stable offset under read_committed)."""
        return self.clusters.latest(tps)

    # -- starting and ending offsets -------------------------------------------------------
    def initial_offsets(self) -> Offsets:
        """Concrete starting offsets of every current partition (Spark's initialOffset)."""
        tps = self.partitions()
        out: Offsets = {}
        for c in self.opts.clusters:
            mine = [tp for tp in tps if tp[0] == c.name]
            out.update(self._resolve(c, c.starting, mine, "startingOffsets"))
        return out

    def ending_offsets(self, tps: list[TP]) -> Offsets:
        spec = self.opts.ending or StartSpec("latest")
        out: Offsets = {}
        for c in self.opts.clusters:
            mine = [tp for tp in tps if tp[0] == c.name]
            out.update(self._resolve(c, spec, mine, "endingOffsets"))
        return out

    def _resolve(
        self, c: ClusterSpec, spec: StartSpec, tps: list[TP], option: str
    ) -> Offsets:
        if not tps and spec.kind not in ("offsets", "timestamps"):
            return {}
        if spec.kind == "earliest":
            return self.clusters.earliest(tps)
        if spec.kind == "latest":
            return self.clusters.latest(tps)
        if spec.kind == "group":
            committed = self.clusters.group_offsets(c, tps)
            missing = [tp for tp in tps if tp not in committed]
            committed.update(self.clusters.earliest(missing) if missing else {})
            return committed
        if spec.kind == "timestamp":
            assert_ts = spec.timestamp if spec.timestamp is not None else 0
            return self._by_time({tp: assert_ts for tp in tps}, "startingTimestamp")
        given = spec.offset_map()
        wanted = {(c.name, t, p): v for (t, p), v in given.items()}
        unknown = [tp for tp in wanted if tp not in tps]
        missing = [tp for tp in tps if tp not in wanted]
        if unknown or missing:
            raise KafkaSourceError(
                f"eo_kafka: option '{option}' must name exactly the partitions of the "
                f"subscription: unknown {[tp_name(t) for t in unknown]}, missing "
                f"{[tp_name(t) for t in missing]}; current partitions "
                f"{[tp_name(t) for t in tps][:20]}"
            )
        if spec.kind == "timestamps":
            return self._by_time(wanted, "startingOffsetsByTimestamp")
        out = {tp: v for tp, v in wanted.items() if v >= 0}
        earliest = [tp for tp, v in wanted.items() if v == EARLIEST]
        latest = [tp for tp, v in wanted.items() if v == LATEST]
        if earliest:
            out.update(self.clusters.earliest(earliest))
        if latest:
            out.update(self.clusters.latest(latest))
        return out

    def _by_time(self, times: Mapping[TP, int], option: str) -> Offsets:
        found = self.clusters.for_times(times)
        missing = [tp for tp, off in found.items() if off < 0]
        if missing and self.opts.timestamp_strategy == "error":
            raise KafkaSourceError(
                f"eo_kafka: option '{option}': no record at or after the timestamp in "
                f"{[tp_name(tp) for tp in missing]}; use an earlier timestamp, or set "
                "startingOffsetsByTimestampStrategy=latest to start at the end there"
            )
        if missing:
            found.update(self.clusters.latest(missing))
        return found

    # -- admission control -----------------------------------------------------------------
    def next_end(
        self,
        start: Mapping[TP, int],
        *,
        latest: Mapping[TP, int],
        max_records: int | None,
        max_bytes: int | None,
    ) -> Offsets:
        """The end of the next window from ``start`` (admission control applied).

        - partitions of ``start`` that disappeared: data loss (error, or dropped with a
          warning under failOnDataLoss=false);
        - new partitions join from earliest;
        - the budget (``max_records``, and ``max_bytes`` through the average record size)
          is split across partitions in proportion to their backlog.
        """
        fail = self.opts.fail_on_data_loss
        latest = self.confirm_behind(start, latest)
        gone = [tp for tp in start if tp not in latest]
        for tp in gone:
            report_data_loss(
                fail,
                f"{tp_name(tp)} no longer exists (topic or partition deleted); offsets from "
                f"{start[tp]} on are not readable",
            )
        for tp, off in latest.items():
            if tp in start and off < start[tp] and fail:
                report_data_loss(
                    True,
                    f"{tp_name(tp)}: the start offset {start[tp]} is beyond the end of the "
                    f"log ({off}); offsets were deleted or the topic was recreated",
                )
        new = [tp for tp in latest if tp not in start]
        eff_start = {tp: start[tp] for tp in latest if tp in start}
        if new:
            eff_start.update(self.clusters.earliest(new))
        budget = max_records
        if max_bytes is not None:
            by_bytes = records_for_bytes(max_bytes, self.avg_record_bytes(eff_start, latest))
            budget = by_bytes if budget is None else min(budget, by_bytes)
        if budget is None:
            end = dict(latest)
        else:
            end = limit_offsets(eff_start, latest, budget)
        for tp in new:  # a new partition is part of the offsets from now on, data or not
            end.setdefault(tp, eff_start[tp])
        return end

    def confirm_behind(self, start: Mapping[TP, int], latest: Mapping[TP, int]) -> Offsets:
        """``latest`` with every end below its partition's start asked again, with fresh
        metadata, up to :data:`BEHIND_CONFIRMATIONS` times :data:`BEHIND_INTERVAL` apart.

        A log's end never moves back while its data is there, but an answer can: a node
        back from a network partition or a restart answers from the log it led before it
        learns it was replaced. Believed, such an end is a false data loss (the query
        stops under failOnDataLoss=true) or a window that goes back and reads offsets again
        (false). Only an end still behind after the last answer is data loss. Spark's
        Kafka source asks again the same way (``fetchOffset.numRetries``, 3, 1 s apart)."""
        out = dict(latest)
        for attempt in range(1, BEHIND_CONFIRMATIONS + 1):
            behind = [tp for tp, off in out.items() if tp in start and off < start[tp]]
            if not behind:
                break
            log.info("eo_kafka: the end of %s came back below the start (%s < %s); asking "
                     "again with fresh metadata (%d of %d)", tp_name(behind[0]),
                     out[behind[0]], start[behind[0]], attempt, BEHIND_CONFIRMATIONS)
            time.sleep(BEHIND_INTERVAL)
            out.update(self.clusters.latest(behind, fresh=True))
        return out

    def avg_record_bytes(self, start: Mapping[TP, int], latest: Mapping[TP, int]) -> float:
        """Average record size (key + value + headers), sampled from the backlog.

        Re-sampled every 10 windows, so a changing record size is followed without
        paying a fetch per trigger.
        """
        if self._avg_record_bytes is not None and self._avg_samples % 10 != 0:
            self._avg_samples += 1
            return self._avg_record_bytes
        self._avg_samples += 1
        backlog = sorted(
            ((latest[tp] - start.get(tp, 0), tp) for tp in latest if latest[tp] > start.get(tp, 0)),
            reverse=True,
        )
        if not backlog:
            return self._avg_record_bytes or 1024.0
        _, tp = backlog[0]
        from connectors.kafka.source.records import sample_record_bytes

        c = self.opts.cluster(tp[0])
        avg = sample_record_bytes(
            c.reader_conf(self.opts.group_id), tp[1], tp[2], start.get(tp, 0), latest[tp]
        )
        if avg is not None:
            self._avg_record_bytes = avg
        return self._avg_record_bytes or 1024.0


    # -- planning --------------------------------------------------------------------------
    def ranges(
        self, start: Mapping[TP, int], end: Mapping[TP, int]
    ) -> list[tuple[OffsetRange, ...]]:
        """The Spark partitions of window ``[start, end)``, each a group of offset ranges
        that one consumer reads: a pure function of its inputs (and the options).

        Large Kafka partition ranges are split (``minPartitions``,
        ``maxRecordsPerPartition``); small ones are grouped up to
        ``targetRecordsPerPartition`` records, so a topic of a thousand small partitions is
        read by a few tasks, not a thousand."""
        o = self.opts
        ranges = plan_ranges(start, end, fail_on_data_loss=o.fail_on_data_loss)
        pieces = split_ranges(ranges, o.min_partitions, o.max_records_per_partition)
        return group_ranges(pieces, o.target_records_per_partition,
                            min_groups=o.min_partitions, max_records=o.max_records_per_partition)

    # -- the window WAL and commits ----------------------------------------------------------
    def record_window(self, start: Offsets, end: Offsets) -> int | None:
        """Append ``{window, start, end}`` to ``<walPath>/source``; return the window id.

        The id is the WAL's own counter: a window identical to the last record is a replay
        and keeps its id; any other window gets ``last + 1`` (0 for an empty WAL). In
        streaming, Spark re-plans a replayed batch with the same (start, end) from its
        offset log, so the replay maps to the same window id.
        """
        if self.wal is None or start == end:
            return None
        last = self.wal.last()
        if last is not None and last.start == start and last.end == end:
            return last.window
        window = 0 if last is None else last.window + 1
        self.wal.append(Window(window, start, end))
        log.info("eo_kafka: window %d planned in %r", window, self.wal)
        return window

    def commit(self, end: Offsets, window: int | None = None) -> int | None:
        """Spark's ``commit(end)`` / a window's commit.

        1. mark the window that ends at ``end`` committed in the WAL;
        2. commit ``end`` to the consumer group, so lag tools see the pipeline (on the group
           committer's thread: the next commit, or stop, waits for it);
        3. purge old windows (the newest ``WAL_KEEP_WINDOWS`` stay for inspection; the
           retention rule of every log, ``WriteAheadLog.retain``).
        """
        began = time.perf_counter()
        if window is None and self.wal is not None:
            window = self.wal.find(end)
        batch = -1 if window is None else window
        # 1.
        if self.wal is not None and window is not None:
            self.wal.commit(window, end)
        failpoints.hit("kafka_source.after_wal_commit", batch)
        # 2.
        self.clusters.commit_group_soon(end)
        failpoints.hit("kafka_source.after_group_commit", batch)
        # 3.
        if self.wal is not None and window is not None:
            self.wal.retain(window, WAL_KEEP_WINDOWS)
        # Observation only (docs/monitoring.md): the commit's time and the WAL's size.
        channel.source_event(
            None if self.wal is None else redact_url(self.wal.url), window,
            time.perf_counter() - began, None if self.wal is None else self.wal.wal.files)
        return window

    # -- batch windows ---------------------------------------------------------------------
    def next_window(self) -> Window | None:
        """The window a batch read with ``walPath`` gets (docs/design.md, "Kafka source").

        - the last window is uncommitted: it again, with exactly the same ranges;
        - otherwise a new window ``[last end, latest)`` (limited by maxOffsetsPerTrigger /
          maxBytesPerTrigger), appended to the WAL before any data is read;
        - None when there is nothing new to read.
        """
        wal = self.wal
        if wal is None:
            raise KafkaSourceError("eo_kafka: batch windows need the walPath option")
        last = wal.last()
        if last is not None and not wal.is_committed(last.window):
            return last
        if last is not None:
            start, window = last.end, last.window + 1
        else:
            start, window = self.initial_offsets(), 0
        # One metadata round trip: partitions gone since ``start`` keep their start offset.
        current = self.partitions()
        end = self.next_end(
            start,
            latest=self.latest(current),
            max_records=self.opts.max_offsets_per_trigger,
            max_bytes=self.opts.max_bytes_per_trigger,
        )
        if total_records(start, end) == 0 and set(end) <= set(start):
            return None
        w = Window(window, start, end)
        wal.append(w)
        log.info("eo_kafka: batch window %d opened: %s", window, self.opts.encode(end))
        return w

    def window(self, window: int) -> Window:
        found = None if self.wal is None else self.wal.get(window)
        if found is None:
            raise KafkaSourceError(
                f"eo_kafka: window {window} is not in the WAL {self.opts.wal_path!r} "
                "(purged, or a different walPath)"
            )
        return found
