"""The transactional delivery mode of the exactly-once Kafka sink (``transactional=true``;
docs/design.md, "Kafka sink: transactional path").

:class:`TransactionalWriter`: one Kafka transaction per task attempt holds its rows and a
commit fact (:mod:`connectors.kafka.sink.commit_facts`); ``init_transactions`` fences a
zombie attempt first, then one stable offset fetch tells whether an earlier attempt
committed. No recovery-key header, no sort, no scan. The rows go out as Kafka record batches
built from the Arrow buffers (:mod:`connectors.kafka.sink.wire_transport`), or, where that path
does not apply, to librdkafka, an Arrow batch per call
(:mod:`connectors.kafka.sink.librdkafka_transport`). The steps every mode shares, and the task
driver, are :class:`connectors.kafka.sink.writer.KafkaWriter`'s.
"""

from __future__ import annotations

import logging
import time

from connectors.core import failpoints
from connectors.core.sink import TaskInfo
from connectors.core.sink_state import SinkState
from connectors.kafka.common import FAMILY, Lease
from connectors.kafka.sink import commit_facts, recovery, transport
from connectors.kafka.sink.librdkafka_transport import LibrdkafkaTransport
from connectors.kafka.sink.options import KafkaSinkOptions
from connectors.kafka.sink.transport import Chunk, ProducePath, Transport
from connectors.kafka.sink.wire_transport import WireTransport
from connectors.kafka.sink.writer import KafkaWriter
from connectors.monitoring import channel

log = logging.getLogger(__name__)

# Failpoint after this mode's commit (see the KafkaSink docstring).
FP_AFTER_TXN_COMMIT = "kafka_sink.after_txn_commit"


class TransactionalWriter(KafkaWriter):
    """``transactional=true``: one Kafka transaction per task attempt holds its rows and
    its commit fact (docs/design.md, "Kafka sink: transactional path").

    The fence (transactional.id ``<sink_id>-<w>``) ends any earlier attempt of (B, w) and
    completes or aborts its open transaction; one stable offset fetch then tells whether
    that attempt committed. Both run while Spark hands over the first rows (:meth:`look`).
    If it did, this one writes nothing and reports the counts the fact recorded; otherwise
    it sends every row (no recovery-key header unless ``recoveryKeyHeaders=true``, no sort),
    adds the fact, and commits.
    """

    looks = True

    def __init__(self, options: KafkaSinkOptions, state: SinkState, task: TaskInfo,
                 path: ProducePath) -> None:
        super().__init__(options, state, task, path)
        self.facts: commit_facts.FactWriter | None = None
        self.facts_lease: Lease[commit_facts.FactWriter] | None = None
        self.fact: commit_facts.CommitFact | None = None

    def whole_task(self) -> bool:
        # A topic column needs every row's topic (and its partition count) first, and
        # recovery keys number the task's rows: both need the whole task first. Otherwise
        # the rows stream: the JVM's conversion of the next batch overlaps sending this one,
        # and the task holds one chunk, not all of its rows.
        return self.options.topic is None or self.options.recovery_key_headers

    def row_order(self) -> str | None:
        return None  # one transaction per attempt: no seq to number

    def header_prefix(self) -> bytes | None:
        if not self.options.recovery_key_headers:
            return None
        return recovery.key_prefix(self.sink_id, self.task.batch_id, self.task.writer_id)

    def open_transport(self, wire_ok: bool = True) -> Transport:
        # The clients are created here and connect in the background while the rows come;
        # look() then fences and reads. The wire transport reads and writes the commit fact
        # over its own cluster; librdkafka's needs the worker's fact consumer.
        if wire_ok and transport.wire_here(self.path, self.options):
            return WireTransport.transactional(self.options, self.task)
        facts = self.facts
        if facts is None:  # (a fallback from the wire keeps the one it has)
            self.facts_lease = commit_facts.fact_writer(
                self.options.producer_conf, self.sink_id, self.task.writer_id,
                self.options.facts_topic, self.options.connect_timeout)
            self.facts = facts = self.facts_lease.client
        try:
            return LibrdkafkaTransport.transactional(self.options, self.task, self.path, facts)
        except BaseException:
            self.release()
            raise

    def look(self) -> None:
        """2T. Fence earlier attempts of (B, w), then read their commit fact
        (``self.fact``)."""
        began = time.perf_counter()
        # Fence first: it completes or aborts an earlier attempt's open transaction, so the
        # fact read below sees its outcome.
        self.transport.fence()
        self.fact = self.transport.read_fact(self.task.batch_id,
                                             commit_facts.scope_of(self.options.wal_path),
                                             self.options.metadata_retry_timeout)
        self.report.scan_seconds = time.perf_counter() - began

    def recover(self, head: Chunk) -> Chunk:
        """After :meth:`look`, once the task has rows: sets ``already_committed`` from the
        fact; with no fact, the started marker guards against a fact Kafka expired (2E)."""
        b = self.task.batch_id
        fact = self.fact
        report = self.report
        report.retry = self.task.attempt > 0 or fact is not None
        # 2E. No fact: create the task's started marker first, or, when an earlier attempt
        #     did, refuse if its fact may have expired (commit_facts.guard_expiry).
        if fact is None:
            write, earlier = commit_facts.guard_expiry(
                self.state, self.options.producer_conf, self.sink_id, b, self.task.writer_id,
                self.options.expired_fact_policy, self.options.metadata_retry_timeout)
            if earlier:
                # That attempt began and never committed: the fence ended it (a zombie's
                # open transaction aborted) or it had failed. Counted, never as output.
                report.retry = True
                report.fenced = 1
            if not write:
                fact = commit_facts.CommitFact(b, 0)  # expiredFactPolicy=skip
        if fact is not None:
            # An earlier attempt of (B, w) committed its transaction: its rows are there.
            report.already_committed = True
            report.skipped = fact.rows
            report.partitions = fact.partitions
            log.info("%s %s: batch %d writer %d: an earlier attempt committed %d rows; this "
                     "one writes nothing", FAMILY, self.sink_id, b, self.task.writer_id,
                     fact.rows)
        return head

    def complete(self) -> None:
        # 3T. (end) The commit fact goes into the transaction, which then commits.
        began = time.perf_counter()
        report = self.report
        fact = commit_facts.CommitFact(self.task.batch_id, report.produced, report.partitions,
                                       commit_facts.scope_of(self.options.wal_path))
        self.transport.commit(fact)
        report.commit_seconds = time.perf_counter() - began
        failpoints.hit(FP_AFTER_TXN_COMMIT, self.task.batch_id)

    def on_failure(self) -> None:
        if self.facts_lease is not None:
            self.facts_lease.discard()  # its state is unknown after an error
            self.facts_lease, self.facts = None, None
        if self.transport.abort():
            # Counted where it ran (its report never reaches a commit; docs/monitoring.md).
            channel.count_event(FAMILY, self.sink_id, self.task.batch_id,
                                transactions_aborted=1)

    def release(self) -> None:
        if self.facts_lease is not None:
            self.facts_lease.release()
            self.facts_lease, self.facts = None, None
