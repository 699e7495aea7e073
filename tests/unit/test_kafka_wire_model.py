"""Model-based tests of the wire producer's state (connectors/kafka/wire/state.py and
partition.py; docs/design.md, "The wire producer's state").

A Hypothesis state machine drives the producer's real state and rules, request by request,
against a model of what Kafka's brokers do with a producer's batches: a log per partition,
the last five batches of each producer id and epoch for deduplication, leaders that move,
a transaction coordinator that fences and ends transactions. Its rules are the events
(records added, requests sent, a request applied by the broker, its answer read, a
connection lost before the answer with the request applied or not and possibly applied
later, a leader moving, the metadata asked again, a call given up, a commit or an abort, a
newer epoch fencing this one) and its invariants the promises:

- no (producer id, epoch, partition, sequence) is ever sent with two different batches;
- the broker's log never holds a batch twice, nor one producer epoch's batches out of
  order;
- every batch the producer counts as acknowledged is in the log exactly once (and after a
  commit, exactly the transaction's acknowledged batches are committed);
- a FENCED, FATAL or CLOSED producer sends nothing more;
- no transition outside the table (the state raises ``IllegalTransition``).

The model is the brokers' rules, not a broker; the real brokers' tiers stay beside it
(tests/integration/cluster_kafka). ``test_the_model_catches_a_sequence_reused_for_other_rows``
breaks one rule on purpose and checks the machine finds it.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from connectors.kafka.wire.partition import Batch, PartitionState
from connectors.kafka.wire.protocol import FENCED, WireError
from connectors.kafka.wire.record_batch import BASE_SEQUENCE_AT
from connectors.kafka.wire.state import (
    SENDING,
    TRANSITIONS,
    Producer,
    ProducerState,
)

TOPIC, PARTITIONS, NODES = "t", 3, 3
OK, NOT_LEADER, OUT_OF_ORDER, DUPLICATE = 0, 6, 45, 46
INVALID_EPOCH, INVALID_TXN_STATE, PRODUCER_FENCED, NOT_ENOUGH_REPLICAS = 47, 48, 90, 19
RECORDS = 4  # records per model batch
PAUSE = 0.1

#: What every run of the machine did, for the coverage test and the closing report.
SEEN: Counter[str] = Counter()


def _batch_bytes(payload: int, seq: int) -> bytearray:
    """A batch's bytes: its payload (the rows it stands for) and its base sequence where a
    record batch has it."""
    data = bytearray(64)
    struct.pack_into(">q", data, 0, payload)
    struct.pack_into(">i", data, BASE_SEQUENCE_AT, seq)
    return data


def _payload(data: bytes | memoryview) -> int:
    return int(struct.unpack_from(">q", data, 0)[0])


@dataclass
class Entry:
    """One batch in a partition's log."""

    pid: int
    epoch: int
    seq: int
    payload: int
    txn: int | None  # the transaction it belongs to (None: idempotent)


@dataclass
class Request:
    """A Produce request in the network."""

    node: int
    pid: int
    epoch: int
    batches: list[tuple[Batch, bytes]]
    connection: int  # which connection to the node it went on (a new one after a loss)
    applied: list[int] | None = None  # the broker's answer codes, once it applied it
    orphan: bool = False  # its connection was lost: its answer never reaches the client


@dataclass
class Broker:
    """The brokers' rules for a producer's batches (Kafka's ProducerStateManager and the
    transaction coordinator, as far as they bear on one producer)."""

    tv2: bool
    leader: list[int] = field(default_factory=lambda: [p % NODES for p in range(PARTITIONS)])
    log: list[list[Entry]] = field(default_factory=lambda: [[] for _ in range(PARTITIONS)])
    #: (partition, pid) -> (epoch, [(seq, count, payload)] of its last five batches)
    state: dict[tuple[int, int], tuple[int, list[tuple[int, int, int]]]] = field(
        default_factory=dict)
    next_pid: int = 100
    epoch: int = -1  # the transactional id's current epoch (transactional runs)
    pid: int = -1
    txn: int = 0  # the open transaction's number
    txn_open: bool = False
    txn_partitions: set[int] = field(default_factory=set)
    committed: set[int] = field(default_factory=set)
    #: Partitions whose next batch is answered NOT_ENOUGH_REPLICAS (not appended).
    short: set[int] = field(default_factory=set)

    def known(self, pid: int, topic: str, partition: int) -> bool:
        return (partition, pid) in self.state

    def produce(self, node: int, pid: int, epoch: int, batch: Batch, data: bytes,
                transactional: bool) -> int:
        p, seq, payload = batch.partition, batch.seq, _payload(data)
        if self.leader[p] != node:
            return NOT_LEADER
        if p in self.short:
            self.short.discard(p)
            return NOT_ENOUGH_REPLICAS
        if transactional:
            if pid != self.pid or epoch != self.epoch:
                return INVALID_EPOCH if pid == self.pid and epoch < self.epoch else (
                    INVALID_TXN_STATE)
            if not self.txn_open:
                if not self.tv2:
                    return INVALID_TXN_STATE  # KIP-890: verified against the coordinator
                self.txn_open = True
            if p not in self.txn_partitions:
                if not self.tv2:
                    return INVALID_TXN_STATE
                self.txn_partitions.add(p)
        known = self.state.get((p, pid))
        if known is not None:
            known_epoch, last = known
            if epoch < known_epoch:
                return INVALID_EPOCH
            if epoch == known_epoch:
                if any(s == seq for s, _, _ in last):
                    return DUPLICATE  # the broker keeps the first copy, whatever this one is
                if seq != last[-1][0] + last[-1][1]:
                    return OUT_OF_ORDER
                last = [*last[-4:], (seq, batch.records, payload)]
            elif seq != 0:
                return OUT_OF_ORDER  # a new epoch starts at 0
            else:
                last = [(seq, batch.records, payload)]
        else:
            last = [(seq, batch.records, payload)]  # a producer id it does not know: any seq
        self.state[(p, pid)] = (epoch, last)
        self.log[p].append(Entry(pid, epoch, seq, payload,
                                 self.txn if transactional else None))
        return OK


class ProducerModel(RuleBasedStateMachine):
    """The producer's state against :class:`Broker` (see the module's docstring)."""

    #: Set by a test to break a rule on purpose (None: the producer as it is).
    mutate: Callable[[ProducerModel], None] | None = None

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.payloads = 0
        self.network: list[Request] = []
        self.sent: dict[tuple[int, int, int, int], bytes] = {}  # (pid, epoch, p, seq) -> bytes
        self.acked: dict[int, int | None] = {}  # payload -> its transaction
        self.sends_while_stopped = 0
        self.fenced = False
        self.connections = Counter()  # node -> the generation of its current connection
        self.steps, self.fence_at = 0, 80
        self.broker = Broker(tv2=False)
        self.core = Producer(None, "model")

    # -- set-up --------------------------------------------------------------------------------
    @initialize(transactional=st.booleans(), tv2=st.booleans(),
                fence_at=st.integers(0, 80))
    def start(self, transactional: bool, tv2: bool, fence_at: int = 80) -> None:
        self.fence_at = fence_at  # no newer epoch before this many steps (most runs: none)
        self.broker = Broker(tv2=tv2)
        self.core = Producer("tx" if transactional else None, "model")
        if transactional:
            self.core.tv2 = tv2
        SEEN[f"run transactional={transactional} tv2={tv2 if transactional else None}"] += 1
        if type(self).mutate is not None:
            type(self).mutate(self)
        self.init()

    @precondition(lambda self: self.core.state in (ProducerState.UNINITIALISED,
                                                   ProducerState.RESET))
    @rule()
    def init(self) -> None:
        """InitProducerId: a new producer id (idempotent), or the transactional id's next
        epoch, which fences every older one and ends its open transaction (aborts it)."""
        b = self.broker
        if self.core.transactional:
            if b.pid < 0:
                b.pid, b.epoch = b.next_pid, 0
                b.next_pid += 1
            else:
                b.epoch += 1
            self.abort_open()
            pid, epoch = b.pid, b.epoch
        else:
            pid, epoch = b.next_pid, 0
            b.next_pid += 1
        self.core.identified(pid, epoch, b.known)

    def abort_open(self) -> None:
        b = self.broker
        if b.txn_open:
            SEEN["broker aborted an open transaction"] += 1
        b.txn_open, b.txn_partitions = False, set()
        b.txn += 1

    # -- records and requests -----------------------------------------------------------------
    @precondition(lambda self: self.core.state in SENDING and self.payloads < 40)
    @rule(partition=st.integers(0, PARTITIONS - 1), count=st.integers(1, 3))
    def add_records(self, partition: int, count: int) -> None:
        """Batches encoded for ``partition``, each with its next sequence; a transactional
        producer's first one opens the transaction (v1: AddPartitionsToTxn answered)."""
        core = self.core
        p = core.partitions.get((TOPIC, partition))
        if p is not None and p.refused is not None:
            return
        leaders = {partition: self.broker.leader[partition]}
        for _ in range(count):
            self.payloads += 1
            data = _batch_bytes(self.payloads, int(core.next_sequences(TOPIC, PARTITIONS)[
                partition]))
            core.spend(TOPIC, data, np.array([[0, 0, len(data), RECORDS]]),
                       np.array([partition]), leaders, self.broker.known)
        if core.transactional:
            core.joined()
            b = self.broker
            if core.tv2:
                return  # each partition joins with its first Produce
            if (core.producer_id, core.epoch) != (b.pid, b.epoch):  # AddPartitionsToTxn fenced
                core.gave_up(WireError("model: fenced", PRODUCER_FENCED))
                return
            b.txn_open = True
            b.txn_partitions.update(core.to_add(TOPIC))
            core.added(TOPIC, core.to_add(TOPIC))

    @rule()
    def send(self) -> None:
        """The requests the producer hands out now go into the network."""
        for node, batches in self.core.requests(TOPIC, self.now):
            if self.core.state not in SENDING:
                self.sends_while_stopped += 1
            request = Request(node, self.core.producer_id, self.core.epoch,
                              [(b, bytes(b.data)) for b in batches],
                              self.connections[node])
            for batch, data in request.batches:
                key = (request.pid, request.epoch, batch.partition, batch.seq)
                assert self.sent.setdefault(key, data) == data, (
                    f"sequence {key} sent with two different batches")
            self.network.append(request)
            SEEN["requests sent"] += 1

    @precondition(lambda self: any(r.applied is None for r in self.network))
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        """The broker applies the oldest request not yet applied of one connection (a
        connection's requests are applied in order), possibly one the client already lost:
        a late append."""
        ways = sorted({(r.node, r.connection) for r in self.network if r.applied is None})
        node, connection = data.draw(st.sampled_from(ways))
        request = next(r for r in self.network if (r.node, r.connection) == (node, connection)
                       and r.applied is None)
        request.applied = [self.broker.produce(request.node, request.pid, request.epoch, b, d,
                                               self.core.transactional)
                           for b, d in request.batches]
        SEEN["late append" if request.orphan else "request applied"] += 1

    @precondition(lambda self: any(r.applied is not None and not r.orphan
                                   for r in self.network))
    @rule(data=st.data())
    def answer(self, data: st.DataObject) -> None:
        """The oldest applied request of a node is answered (a connection answers in
        order)."""
        nodes = sorted({r.node for r in self.network if not r.orphan})
        self._answer(data.draw(st.sampled_from(nodes)))

    def _answer(self, node: int) -> None:
        request = next(r for r in self.network if r.node == node and not r.orphan)
        if request.applied is None:
            return  # the connection's next answer is not there yet
        self.network.remove(request)
        core = self.core
        core.finished(node)
        for (batch, _), code in zip(request.batches, request.applied, strict=True):
            if core.state is ProducerState.CLOSED:
                break
            error = None if code in (OK, DUPLICATE) else WireError(f"model: {code}", code)
            if core.answered(node, batch, code, self.now, PAUSE, error):
                self.acked[_payload(batch.data)] = (self.broker.txn
                                                    if core.transactional else None)
            SEEN[f"answer {code}"] += 1

    @precondition(lambda self: any(not r.orphan for r in self.network))
    @rule()
    def round_trip(self) -> None:
        """A good moment: the broker applies every request still in the network (late ones
        too) and each connection's answers come, in order."""
        for request in self.network:
            if request.applied is None:
                request.applied = [self.broker.produce(request.node, request.pid,
                                                       request.epoch, b, d,
                                                       self.core.transactional)
                                   for b, d in request.batches]
        while any(not r.orphan for r in self.network):
            node = next(r.node for r in self.network if not r.orphan)
            self._answer(node)
        self.network = []

    @precondition(lambda self: self.core.state in SENDING
                  and not self.core.settled(TOPIC))
    @rule()
    def calm(self) -> None:
        """A calm stretch: time passes, leaders are asked again, everything goes out and is
        applied and answered, until the producer's batches are settled (or it stops)."""
        for _ in range(12):
            if self.core.settled(TOPIC) or self.core.state not in SENDING:
                break
            self.now += 1.0
            if any(p.stale for p in self.core.partitions.values()):
                self.refresh()
            self.send()
            if any(not r.orphan for r in self.network):
                self.round_trip()

    @precondition(lambda self: any(not r.orphan for r in self.network))
    @rule(data=st.data())
    def lose_connection(self, data: st.DataObject) -> None:
        """A node's connection breaks: its requests' answers never come (each request
        applied or not, and one not applied yet may still be applied later)."""
        node = data.draw(st.sampled_from(sorted({r.node for r in self.network
                                                 if not r.orphan})))
        for r in self.network:
            if r.node == node:
                r.orphan = True
        self.connections[node] += 1
        self.network = [r for r in self.network if not (r.orphan and r.applied is not None)]
        self.core.lost(node, self.now, PAUSE)
        SEEN["connection lost"] += 1

    @rule(partition=st.integers(0, PARTITIONS - 1), node=st.integers(0, NODES - 1))
    def leader_moves(self, partition: int, node: int) -> None:
        self.broker.leader[partition] = node

    @rule(partition=st.integers(0, PARTITIONS - 1))
    def replicas_short(self, partition: int) -> None:
        """The partition's next batch is refused for now (NOT_ENOUGH_REPLICAS), not
        appended: the batches behind it are answered OUT_OF_ORDER_SEQUENCE_NUMBER."""
        self.broker.short.add(partition)

    @precondition(lambda self: any(p.stale for p in self.core.partitions.values()))
    @rule()
    def refresh(self) -> None:
        """Fresh metadata: every partition's current leader."""
        for p in self.core.partitions.values():
            p.leader, p.stale = self.broker.leader[p.partition], False

    @rule(seconds=st.sampled_from([0.05, 0.5, 5.0]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @precondition(lambda self: self.core.state in SENDING and not self.in_flight() and (
        self.core.refusal(TOPIC) is not None or not self.core.settled(TOPIC)))
    @rule()
    def give_up(self) -> None:
        """The produce call ends unsettled: a refusal, or ``message.timeout.ms``."""
        error = self.core.refusal(TOPIC) or WireError("model: message.timeout.ms", 7)
        self.core.failed(error)
        SEEN[f"gave up: {self.core.state.name}"] += 1

    # -- transactions --------------------------------------------------------------------------
    @precondition(lambda self: self.core.state is ProducerState.IN_TRANSACTION
                  and not self.in_flight() and all(p.clean for p in
                                                   self.core.partitions.values()))
    @rule()
    def commit(self) -> None:
        core, b = self.core, self.broker
        core.ending(True)
        if (core.producer_id, core.epoch) != (b.pid, b.epoch):
            core.gave_up(WireError("model: fenced", PRODUCER_FENCED))
            return
        txn = b.txn
        b.committed.add(txn)
        b.txn_open, b.txn_partitions = False, set()
        b.txn += 1
        if core.tv2:
            b.epoch += 1  # EndTxn v5 bumps the epoch
            core.ended(b.pid, b.epoch, b.known)
        else:
            core.ended(-1, -1, b.known)
        committed = sorted(e.payload for log in b.log for e in log if e.txn == txn)
        acked = sorted(k for k, t in self.acked.items() if t == txn)
        assert committed == acked, f"transaction {txn}: committed {committed}, acked {acked}"
        SEEN["committed"] += 1

    @precondition(lambda self: self.core.open and not self.in_flight()
                  and (self.core.tv2 or not self.core.uncertain))
    @rule()
    def abort(self) -> None:
        """EndTxn(abort): not while a request's outcome is unknown under transactions v1
        (the transport leaves that to the next InitProducerId)."""
        core, b = self.core, self.broker
        core.ending(False)
        if (core.producer_id, core.epoch) != (b.pid, b.epoch):
            core.gave_up(WireError("model: fenced", PRODUCER_FENCED))
            return
        self.abort_open()
        if core.tv2:
            b.epoch += 1
            core.ended(b.pid, b.epoch, b.known)
        else:
            core.ended(-1, -1, b.known)
        SEEN["aborted"] += 1

    @precondition(lambda self: self.core.transactional and self.broker.pid >= 0
                  and not self.fenced and self.steps >= self.fence_at)
    @rule()
    def fence(self) -> None:
        """A newer attempt of the task takes the transactional id (InitProducerId); once a
        run, or nothing else would happen in most runs."""
        self.fenced = True
        self.broker.epoch += 1
        self.abort_open()
        SEEN["fenced by a newer epoch"] += 1

    @precondition(lambda self: self.core.state is ProducerState.ABORTABLE
                  and self.core.uncertain and not self.core.tv2)
    @rule()
    def close(self) -> None:
        """The attempt ends without an abort (its outcome unknown under v1): closed."""
        self.core.close()

    # -- the promises ---------------------------------------------------------------------------
    def in_flight(self) -> bool:
        return any(p.in_flight for p in self.core.partitions.values())

    @invariant()
    def the_log_holds_each_batch_once_and_in_order(self) -> None:
        for p, log in enumerate(self.broker.log):
            payloads = [e.payload for e in log]
            assert len(payloads) == len(set(payloads)), f"partition {p}: a batch twice"
            last: dict[tuple[int, int], int] = {}
            for e in log:
                key = (e.pid, e.epoch)
                assert e.seq > last.get(key, -1), f"partition {p}: {key} out of order"
                last[key] = e.seq

    @invariant()
    def every_acknowledged_batch_is_in_the_log_once(self) -> None:
        logged = Counter(e.payload for log in self.broker.log for e in log)
        for payload in self.acked:
            assert logged[payload] == 1, f"batch {payload} acknowledged, in the log " \
                                         f"{logged[payload]} times"

    @invariant()
    def a_stopped_producer_sends_nothing(self) -> None:
        assert self.sends_while_stopped == 0
        if self.core.state not in SENDING:
            assert self.core.requests(TOPIC, self.now + 1e6) == []

    @invariant()
    def count(self) -> None:
        self.steps += 1
        SEEN[f"state {self.core.state.name}"] += 1

    def teardown(self) -> None:
        for (a, b), n in self.core.moves.items():
            SEEN[f"transition {a.name} -> {b.name}"] += n


RUN = settings(max_examples=800, stateful_step_count=50, deadline=None, derandomize=True,
               suppress_health_check=list(HealthCheck), database=None)


def test_the_producer_keeps_its_promises_against_the_brokers_rules() -> None:
    run_state_machine_as_test(ProducerModel, settings=RUN)
    taken = {k for k in SEEN if k.startswith("transition ")}
    table = {f"transition {a.name} -> {b.name}" for a, targets in TRANSITIONS.items()
             for b in targets}
    print("\nmodel runs:", {k: v for k, v in sorted(SEEN.items()) if not k.startswith(
        ("transition", "state"))})
    print("states:", {k[6:]: v for k, v in sorted(SEEN.items()) if k.startswith("state ")})
    print(f"transitions taken: {len(taken)} of {len(table)} in the table:",
          sorted(k[11:] for k in taken))
    assert taken <= table
    for needed in ("UNINITIALISED -> READY", "READY -> IN_TRANSACTION", "READY -> RESET",
                   "RESET -> READY", "IN_TRANSACTION -> COMMITTING", "COMMITTING -> READY",
                   "IN_TRANSACTION -> ABORTABLE", "ABORTABLE -> ABORTING",
                   "ABORTING -> READY"):
        assert f"transition {needed}" in taken, f"the model never took {needed}"
    for event in ("late append", "connection lost", f"answer {DUPLICATE}",
                  f"answer {OUT_OF_ORDER}", f"answer {NOT_LEADER}", "committed", "aborted"):
        assert SEEN[event], f"the model never saw {event}"


def _reencode_on_retry(model: ProducerModel) -> None:
    """The broken rule: a batch sent again after a retriable answer is encoded anew, with
    other rows under its spent sequence."""
    if getattr(PartitionState.again, "broken", False):
        return
    again = PartitionState.again

    def broken(self: PartitionState, batch: Batch, now: float, pause: float) -> None:
        model.payloads += 1
        batch.data = memoryview(_batch_bytes(model.payloads, batch.seq))
        again(self, batch, now, pause)

    broken.broken = True  # type: ignore[attr-defined]
    PartitionState.again = broken  # type: ignore[method-assign]


def test_the_model_catches_a_sequence_reused_for_other_rows(monkeypatch) -> None:
    """Break one rule on purpose (re-encoding different rows under a spent sequence on a
    retry): the machine must find it. Found, not shrunk (shrinking it took two minutes of
    CI); a failure of the real rules above is shrunk as usual."""
    monkeypatch.setattr(PartitionState, "again", PartitionState.again)  # restored after
    monkeypatch.setattr(ProducerModel, "mutate", staticmethod(_reencode_on_retry))
    with pytest.raises(AssertionError, match="sent with two different batches|acknowledged"):
        run_state_machine_as_test(ProducerModel, settings=settings(
            RUN, max_examples=500, phases=[Phase.explicit, Phase.generate]))


@pytest.mark.parametrize("code", sorted(FENCED))
def test_a_fenced_transactional_send_stops_every_request(code: int) -> None:
    """One fixed run: a fenced answer, then nothing more goes out."""
    core = Producer("tx", "model")
    core.tv2 = True
    core.identified(5, 0, lambda *_: True)
    for i in range(3):
        data = _batch_bytes(i, int(core.next_sequences(TOPIC, 1)[0]))
        core.spend(TOPIC, data, np.array([[0, 0, len(data), RECORDS]]), np.array([0]), {0: 0},
                   lambda *_: True)
    core.joined()
    (node, batches), *_ = core.requests(TOPIC, 0.0)
    core.finished(node)
    error = WireError("fenced", code)
    core.answered(node, batches[0], code, 0.0, PAUSE, error)
    core.failed(error)
    assert core.state is ProducerState.FENCED and core.requests(TOPIC, 1e6) == []
