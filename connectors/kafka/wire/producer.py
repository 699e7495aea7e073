"""The wire producer: Kafka record batches sent with Kafka's own requests, idempotent or in
one transaction (docs/design.md, "Record batches on the wire", "The wire client's failures"
and "The wire producer's state").

:class:`WireProducer` speaks for a :class:`~connectors.kafka.wire.state.Producer`, the
producer's state and rules: ``InitProducerId`` (the fence of a transactional id, as
``init_transactions``), ``AddPartitionsToTxn``, ``Produce`` (:mod:`connectors.kafka.wire.
sender`), ``AddOffsetsToTxn`` and ``TxnOffsetCommit`` (what ``send_offsets_to_transaction``
sends), ``EndTxn``. Under transactions v2 (KIP-890 part 2, where the cluster finalized it) no
``AddPartitionsToTxn`` or ``AddOffsetsToTxn``, and ``EndTxn`` bumps the epoch. It sends over
the process's :class:`~connectors.kafka.wire.cluster.Cluster`: the connections, leaders and
coordinators every other caller uses too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pyarrow as pa

from connectors.kafka.wire import record_batch, requests
from connectors.kafka.wire.cluster import GROUP, TRANSACTION, Cluster
from connectors.kafka.wire.protocol import (
    ADD_OFFSETS,
    ADD_PARTITIONS,
    CONCURRENT_TRANSACTIONS,
    COORDINATOR_MOVED,
    END_TXN,
    ERRORS,
    FENCED,
    INIT_PRODUCER_ID,
    TV2_VERSIONS,
    TXN_OFFSET_COMMIT,
    VERSIONS,
    Connection,
    UnsupportedBroker,
    WireError,
)
from connectors.kafka.wire.sender import Sender
from connectors.kafka.wire.settings import Settings
from connectors.kafka.wire.state import SENDING, Producer, ProducerState
from connectors.kafka.wire.state import ProducerState as S

log = logging.getLogger(__name__)

T = TypeVar("T")

#: The first AddPartitionsToTxn version of brokers that verify a transaction's partitions
#: before appending (KIP-890 part 1, Kafka 3.6): older brokers let a late Produce of an
#: aborted transaction open a new one, so transactions on the wire need 3.6 or later.
VERIFYING_ADD_PARTITIONS = 4
#: How often a request is asked again after CONCURRENT_TRANSACTIONS.
CONCURRENT_POLL = 0.05
#: The cluster-wide feature and level that turn transactions v2 on.
TRANSACTION_VERSION, TV2_LEVEL = requests.TRANSACTION_VERSION, requests.TV2_LEVEL


class WireProducer:
    """One producer on Kafka's wire protocol: transactional (one task attempt) with a
    ``transactional_id``, else idempotent (kept by a worker, task after task). Never used by
    two threads at once (the worker's cache leases it to one holder); it shares the
    process's ``cluster`` with everyone else."""

    def __init__(self, cluster: Cluster, settings: Settings, transactional_id: str | None,
                 who: str, retry_timeout: float) -> None:
        self.cluster = cluster
        self.settings = settings
        self.who = who
        self.retry_timeout = retry_timeout
        self.core = Producer(transactional_id, who)

    # -- what the transports read ----------------------------------------------------------------
    @property
    def transactional_id(self) -> str | None:
        return self.core.transactional_id

    @property
    def producer_id(self) -> int:
        return self.core.producer_id

    @property
    def epoch(self) -> int:
        return self.core.epoch

    @property
    def tv2(self) -> bool | None:
        return self.core.tv2

    @property
    def state(self) -> ProducerState:
        return self.core.state

    @property
    def open(self) -> bool:
        return self.core.open

    @property
    def uncertain(self) -> bool:
        return self.core.uncertain

    def close(self) -> None:
        """Nothing of the cluster is closed: its connections serve the next caller."""
        self.core.close()

    # -- set-up ----------------------------------------------------------------------------------
    def init(self, timeout: float) -> None:
        """``InitProducerId``: fences every older producer of this transactional id and
        completes or aborts its open transaction (retried while it is being completed).
        Without a transactional id: a producer id for idempotent writes (any broker); a
        RESET producer takes a new one here. :class:`UnsupportedBroker` for a broker older
        than Kafka 2.1, or 3.6 for transactions."""
        core = self.core
        core.expect({S.UNINITIALISED, S.RESET}, "InitProducerId")
        self.cluster.require(VERSIONS, self.who)
        txn = core.transactional_id
        if txn is not None:
            if not self.cluster.serves(ADD_PARTITIONS, VERIFYING_ADD_PARTITIONS):
                raise UnsupportedBroker(
                    f"{self.who}: the brokers of {self.cluster.name} are older than Kafka 3.6 "
                    "and do not verify a transaction's partitions before appending (KIP-890), "
                    "so a late Produce of an aborted transaction could open another; "
                    "transactions go through librdkafka there")
            if core.tv2 is None:
                core.tv2 = self.cluster.finalized().get(TRANSACTION_VERSION, 0) >= TV2_LEVEL
                self.cluster.note(f"{self.who}: transactions v{2 if core.tv2 else 1} on the "
                                  f"wire ({self.cluster.name})")
        body = requests.init_producer_id(txn, self.settings.transaction_timeout_ms)

        def ask() -> tuple[int, int]:
            to = self.cluster.connect() if txn is None else self.txn_coordinator()
            error, pid, epoch = requests.read_init_producer_id(to.call(INIT_PRODUCER_ID, body))
            self.check(error, "InitProducerId", coordinator=True)
            return pid, epoch

        pid, epoch = self.retrying(ask, f"InitProducerId of transactional.id {txn!r}",
                                   max(timeout, self.retry_timeout))
        if core.state is S.RESET:
            log.info("%s: producer id %d after a failed send left producer id %d's sequences "
                     "unsettled", self.who, pid, core.producer_id)
        core.identified(pid, epoch, self.cluster.knows)

    def txn_coordinator(self) -> Connection:
        txn = self.core.transactional_id
        if txn is None:
            raise WireError(f"{self.who}: no transaction without a transactional.id "
                            "(internal)", -1)
        return self.cluster.connection(self.cluster.coordinator(txn, TRANSACTION))

    def prepare(self, topic: str, group: str) -> None:
        """What the transaction will need, asked before the rows come: the target's leaders
        and the fact group's coordinator."""
        self.refresh(topic)
        self.retrying(lambda: self.group_coordinator(group), f"FindCoordinator of {group!r}",
                      self.retry_timeout)

    def group_coordinator(self, group: str) -> Connection:
        return self.cluster.connection(self.cluster.coordinator(group, GROUP))

    def refresh(self, topic: str, partitions: int = 0) -> None:
        """Every partition's leader of ``topic`` (``Cluster.topic_leaders``), into the
        producer's partitions."""
        self.core.take_leaders(topic, self.cluster.topic_leaders(topic, partitions, self.who,
                                                                 self.retry_timeout))

    # -- the records -----------------------------------------------------------------------------
    def produce(self, topic: str, partition_count: int, values: pa.Array,
                keys: pa.Array | None, parts: np.ndarray, order: np.ndarray,
                header: tuple[str, bytes] | None = None) -> int:
        """Send the rows ``order`` (grouped by target partition) to ``topic`` (in this
        transaction, if transactional) and return once every batch is acknowledged; returns
        the number of records. ``header``: a recovery key on each record
        (``record_batch.encode``)."""
        core = self.core
        if not len(order):
            return 0
        core.expect(SENDING, "records")
        found = self.cluster.topic_leaders(topic, partition_count, self.who,
                                           self.retry_timeout).leaders
        data, batches, partitions = record_batch.encode(
            values, keys, order, parts, core.next_sequences(topic, partition_count),
            core.producer_id, core.epoch, self.settings.max_batch_bytes,
            transactional=core.transactional, header=header)
        sizes = batches[:, 2] - batches[:, 1]
        if (sizes > self.settings.max_batch_bytes).any():  # one record alone is too big
            i = int(np.argmax(sizes))
            raise WireError(
                f"{self.who}: a record for {topic}[{int(partitions[batches[i, 0]])}] is too "
                f"large: {int(sizes[i])} bytes as a record batch, above message.max.bytes="
                f"{self.settings.max_batch_bytes} (option kafka.message.max.bytes; the "
                "topic's max.message.bytes bounds it on the broker); nothing of the task is "
                "committed", 10)
        core.spend(topic, data, batches, partitions, found, self.cluster.knows)
        if core.transactional:
            core.joined()
            if not core.tv2:
                self.add_partitions(topic, core.to_add(topic))
        Sender(core, self.cluster, self.settings, topic, who=self.who,
               timeout=self.retry_timeout, error=self.error).run()
        return int(batches[:, 3].sum())

    def add_partitions(self, topic: str, partitions: list[int]) -> None:
        """AddPartitionsToTxn of the partitions not in the transaction yet (v1)."""
        if not partitions:
            return
        core = self.core
        body = requests.add_partitions(str(core.transactional_id), core.producer_id,
                                       core.epoch, topic, partitions)

        def ask() -> None:
            answers = requests.read_add_partitions(self.txn_coordinator().call(ADD_PARTITIONS,
                                                                               body))
            for code in sorted(set(answers.values()) - {0}):
                self.check(code, f"AddPartitionsToTxn of {topic!r}", coordinator=True)

        self.transactional_request(ask, f"AddPartitionsToTxn of {len(partitions)} partitions "
                                        f"of {topic!r}")
        core.added(topic, partitions)

    def send_offset(self, group: str, topic: str, partition: int, offset: int,
                    metadata: str) -> None:
        """``send_offsets_to_transaction`` of one offset: AddOffsetsToTxn (v1), then
        TxnOffsetCommit to the group's coordinator."""
        core = self.core
        core.joined()
        txn = str(core.transactional_id)
        if not core.tv2:  # v2: the group joins with the TxnOffsetCommit
            body = requests.add_offsets(txn, core.producer_id, core.epoch, group)

            def add() -> None:
                error = requests.read_add_offsets(self.txn_coordinator().call(ADD_OFFSETS,
                                                                              body))
                self.check(error, f"AddOffsetsToTxn of group {group!r}", coordinator=True)

            self.transactional_request(add, f"AddOffsetsToTxn of group {group!r}")
        encode, read = ((requests.txn_offset_commit_v5, requests.read_txn_offset_commit_v5)
                        if core.tv2 else (requests.txn_offset_commit_v2,
                                          requests.read_txn_offset_commit_v2))
        version = (TV2_VERSIONS if core.tv2 else VERSIONS)[TXN_OFFSET_COMMIT]
        body = encode(txn, group, core.producer_id, core.epoch, topic, partition, offset,
                      metadata)

        def commit() -> None:
            errors = read(self.group_coordinator(group).call(TXN_OFFSET_COMMIT, body,
                                                             version=version))
            for error in errors:
                if error in COORDINATOR_MOVED:
                    self.cluster.forget(group, GROUP)
                self.check(error, f"TxnOffsetCommit of group {group!r}")

        self.transactional_request(commit, f"TxnOffsetCommit of group {group!r}")

    def end(self, commit: bool) -> None:
        """``EndTxn``: commit or abort what this attempt added. Sent again after a lost
        answer: the coordinator answers a repeated EndTxn of the same outcome with success
        (under transactions v2 too: it knows the epoch it bumped)."""
        core = self.core
        core.ending(commit)
        txn = str(core.transactional_id)
        v2 = bool(core.tv2)
        encode, read = ((requests.end_txn_v5, requests.read_end_txn_v5) if v2
                        else (requests.end_txn_v2, requests.read_end_txn_v2))
        version = (TV2_VERSIONS if v2 else VERSIONS)[END_TXN]
        body = encode(txn, core.producer_id, core.epoch, commit)

        def ask() -> tuple[int, int]:
            error, pid, epoch = read(self.txn_coordinator().call(END_TXN, body,
                                                                 version=version))
            self.check(error, "EndTxn", coordinator=True)
            return pid, epoch

        what = "EndTxn (commit)" if commit else "EndTxn (abort)"
        try:
            pid, epoch = self.retrying(ask, what, self.retry_timeout)
        except WireError as e:
            core.gave_up(e)
            raise
        core.ended(pid, epoch, self.cluster.knows)

    # -- errors ----------------------------------------------------------------------------------
    def transactional_request(self, ask: Callable[[], None], what: str) -> None:
        """``ask`` retried; a failure for good moves the producer on (:meth:`Producer.
        gave_up`) before it is raised."""
        try:
            self.retrying(ask, what, self.retry_timeout)
        except WireError as e:
            self.core.gave_up(e)
            raise

    def check(self, code: int, request: str, coordinator: bool = False) -> None:
        if code == 0:
            return
        txn = self.core.transactional_id
        if coordinator and code in COORDINATOR_MOVED and txn is not None:
            self.cluster.forget(txn, TRANSACTION)
        raise self.error(code, request)

    def error(self, code: int, request: str) -> WireError:
        name = ERRORS.get(code, f"error {code}")
        if code in FENCED:
            return WireError(f"{self.who}: {request}: {name}: a newer attempt of this task "
                             f"fenced transactional.id {self.core.transactional_id!r}", code)
        return WireError(f"{self.who}: {request}: {name}", code)

    def backoff(self, attempt: int, reconnect: bool = False) -> float:
        return self.cluster.backoff(attempt, reconnect)

    def retrying(self, ask: Callable[[], T], what: str, timeout: float) -> T:
        """``ask()`` until it succeeds, a non-retriable error, or ``timeout`` (the wire
        client's retry: a lost connection is retriable and every coordinator is found again).
        CONCURRENT_TRANSACTIONS, the previous transaction's markers still being written,
        ends on the broker's time, not ours: it is polled at a short, fixed interval (Java
        polls AddPartitionsToTxn at 20 ms) instead of doubling to 1 s, which overshot their
        end by up to a second per task."""
        return self.cluster.retrying(ask, what, timeout, who=self.who,
                                     poll={CONCURRENT_TRANSACTIONS: CONCURRENT_POLL})
