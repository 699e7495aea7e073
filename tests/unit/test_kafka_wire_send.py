"""The wire producer's Produce requests (``wire.sender.Sender`` over the producer's
``PartitionState``\\ s) against a scripted leader: which batches go out before which
answers, what is sent again, and with which bytes. The model-based tests
(tests/unit/test_kafka_wire_model.py) drive the same state against a model of the broker's
rules; the real brokers' tiers are in tests/integration/cluster_kafka."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from connectors.kafka.wire.cluster import Cluster
from connectors.kafka.wire.producer import ProducerState, WireProducer
from connectors.kafka.wire.protocol import (
    OUT_OF_ORDER_SEQUENCE,
    ConnectionLost,
    Reader,
    WireError,
    compact,
    string,
    uvarint,
)
from connectors.kafka.wire.record_batch import BASE_SEQUENCE_AT
from connectors.kafka.wire.requests import TopicMetadata
from connectors.kafka.wire.settings import Settings

NOT_LEADER_OR_FOLLOWER, MESSAGE_TOO_LARGE, DUPLICATE_SEQUENCE = 6, 10, 46
BATCH = 64  # bytes of a test batch: its index at byte 0, its base sequence where Kafka's is


class ScriptedLeader:
    """Node 0's connection. Batch ``i`` of the test starts with byte ``i``; ``codes[i]`` is
    a list of the answers its sends get, in turn (then: acknowledged). ``lose`` holds the
    indexes of sends (counted over the connection's life) whose answer never comes: the
    connection breaks there. Records what was sent and answered, in order. Speaks Produce
    v7, or v12 (flexible) when the request is."""

    def __init__(self, codes: dict[int, list[int]], lose: set[int] | None = None,
                 break_send: set[int] | None = None) -> None:
        self.codes = codes
        self.lose = lose or set()
        self.break_send = break_send or set()  # sends (counted) the connection breaks under
        self.sends = 0
        self.events: list[tuple[str, list[int]]] = []
        self.requests: dict[int, list[tuple[int, int]]] = {}
        self.sent_bytes: list[bytes] = []
        self.broken = False
        self.pending: dict[int, int] = {}
        self.versions: set[int] = set()

    def usable(self) -> bool:
        return not self.broken

    def expiring(self) -> bool:
        return False

    def send(self, api: int, parts: list, version: int) -> int:
        if self.broken:
            raise ConnectionLost("closed", 0)
        self.sends += 1
        if self.sends - 1 in self.break_send:
            self.broken = True
            self.events.append(("broke at send", []))
            raise ConnectionLost("the test broke it at a send", 0)
        self.versions.add(version)
        if version >= 9:  # [partition, uvarint size + 1] records [no tags], ... + 2 tags
            count = bytes(parts[0])[-1] - 1
            assert bytes(parts[-1]) == b"\x00\x00"
            batches = [(struct.unpack_from(">i", bytes(parts[1 + 3 * i]))[0],
                        bytes(parts[2 + 3 * i])) for i in range(count)]
            assert all(bytes(parts[3 + 3 * i]) == b"\x00" for i in range(count))
        else:
            count = struct.unpack(">i", bytes(parts[0])[-4:])[0]
            batches = [(struct.unpack(">ii", bytes(parts[1 + 2 * i]))[0],
                        bytes(parts[2 + 2 * i])) for i in range(count)]
        correlation = len(self.requests)
        self.requests[correlation] = [(part, data[0]) for part, data in batches]
        self.sent_bytes += [data for _, data in batches]
        self.pending[correlation] = api
        self.events.append(("send", [data[0] for _, data in batches]))
        return correlation

    def receive(self, correlation: int) -> Reader:
        self.pending.pop(correlation, None)
        if correlation in self.lose:
            self.broken = True
            self.events.append(("lost", [i for _, i in self.requests[correlation]]))
            raise ConnectionLost("the test broke it", 1)
        batches = self.requests[correlation]
        self.events.append(("answer", [i for _, i in batches]))
        answers = [(part, (self.codes.get(i) or [0]).pop(0) if self.codes.get(i) else 0)
                   for part, i in batches]
        if 12 in self.versions:  # record errors, an error message and a current leader
            body = uvarint(2) + compact("t") + uvarint(len(batches) + 1)
            for part, code in answers:
                body += (struct.pack(">ih", part, code) + bytes(24)
                         + uvarint(2) + struct.pack(">i", 0) + compact("bad") + b"\x00"
                         + compact("why" if code else None)
                         + b"\x01\x00\x08" + struct.pack(">ii", 2, 5))
            return Reader(body + b"\x00" + struct.pack(">i", 0) + b"\x00")
        body = struct.pack(">i", 1) + string("t") + struct.pack(">i", len(batches))
        for part, code in answers:
            body += struct.pack(">ih", part, code) + bytes(24)
        return Reader(body + struct.pack(">i", 0))

    def close(self) -> None:
        self.broken = True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def _producer(leader: ScriptedLeader, pid: int, tv2: bool = False,
              known: bool = False) -> tuple[WireProducer, Clock]:
    """A producer whose partitions 0..3 of topic "t" all lead on node 0 (the scripted
    leader), at producer id ``pid``, epoch 0."""
    clock = Clock()
    cluster = Cluster(Settings.of({"bootstrap.servers": "127.0.0.1:1"}), clock=clock,
                      sleep=clock.sleep)
    cluster.brokers[0] = ("127.0.0.1", 1)
    cluster.connections[0] = leader  # type: ignore[assignment]
    meta = TopicMetadata(0, dict.fromkeys(range(4), 0), dict.fromkeys(range(4), 5))
    cluster.leaders = lambda topics, max_age=0: {t: meta for t in topics}  # type: ignore
    cluster.stale = lambda topic: None  # type: ignore[method-assign]
    if known:
        cluster.learned(pid, "t", 0)
    producer = WireProducer(cluster, Settings.of({"bootstrap.servers": "127.0.0.1:1"}),
                            "tx" if tv2 else None, "test", 30.0)
    producer.core.tv2 = tv2
    producer.core.identified(pid, 0, cluster.knows)
    if tv2:
        producer.core.joined()
    return producer, clock


def _send(producer: WireProducer, n: int = 3, first: int = 0) -> None:
    """Batches ``first`` .. ``first + n - 1`` of partition 0, 10 records each, sent until
    settled."""
    from connectors.kafka.wire.sender import Sender

    core = producer.core
    for i in range(first, first + n):
        data = bytearray(BATCH)
        data[0] = i
        struct.pack_into(">i", data, BASE_SEQUENCE_AT, int(core.next_sequences("t", 1)[0]))
        core.spend("t", data, np.array([[0, 0, BATCH, 10]]), np.array([0]), {0: 0},
                   producer.cluster.knows)
    Sender(core, producer.cluster, producer.settings, "t", who="test", timeout=30.0,
           error=producer.error).run()


@pytest.mark.parametrize("tv2", [False, True], ids=["produce-v7", "produce-v12"])
def test_a_partition_new_to_the_producer_id_waits_for_its_first_batch(tv2):
    """The broker takes any sequence from a producer id it does not know: the second batch
    goes only once the first is acknowledged. Then pipelining resumes."""
    leader = ScriptedLeader({})
    producer, _ = _producer(leader, pid=7, tv2=tv2)
    _send(producer)
    assert leader.events[:3] == [("send", [0]), ("answer", [0]), ("send", [1])]
    assert producer.cluster.knows(7, "t", 0)
    leader.events.clear()
    _send(producer, first=3)
    assert leader.events[:3] == [("send", [3]), ("send", [4]), ("send", [5])]
    assert producer.core.partition("t", 0).clean


def test_a_first_batch_refused_for_now_goes_again_before_the_later_ones():
    """NOT_LEADER_OR_FOLLOWER from a node about to become the leader: had the second batch
    gone and been taken, the first could never be appended (OUT_OF_ORDER_SEQUENCE_NUMBER,
    what the 3-node cluster answered on every first write into a new topic)."""
    leader = ScriptedLeader({0: [NOT_LEADER_OR_FOLLOWER]})
    producer, clock = _producer(leader, pid=8)
    _send(producer)
    assert leader.events[:4] == [("send", [0]), ("answer", [0]), ("send", [0]),
                                 ("answer", [0])]
    assert clock.pauses and clock.pauses[0] == pytest.approx(0.1)  # retry.backoff.ms
    assert producer.core.partition("t", 0).clean


@pytest.mark.parametrize("tv2", [False, True], ids=["produce-v7", "produce-v12"])
def test_a_known_producer_id_pipelines_and_sends_a_gap_again_in_order(tv2):
    """Where the broker knows the producer id it refuses a gap, so later batches may be in
    flight; an OUT_OF_ORDER_SEQUENCE_NUMBER behind a refused batch goes again with it, after
    it, with the same bytes."""
    leader = ScriptedLeader({0: [NOT_LEADER_OR_FOLLOWER], 1: [OUT_OF_ORDER_SEQUENCE],
                             2: [OUT_OF_ORDER_SEQUENCE]})
    producer, _ = _producer(leader, pid=9, tv2=tv2, known=True)
    _send(producer)
    sends = [i for kind, batch in leader.events if kind == "send" for i in batch]
    assert leader.events[:3] == [("send", [0]), ("send", [1]), ("send", [2])]
    assert sends == [0, 1, 2, 0, 1, 2]
    assert leader.sent_bytes[:3] == leader.sent_bytes[3:]  # the same bytes, not re-encoded


def test_a_lost_connection_sends_its_batches_again_and_a_duplicate_is_success():
    """The answer to the first request never comes (the connection breaks): its batch went
    to the broker after all, so the resend is answered DUPLICATE_SEQUENCE_NUMBER, which
    settles it; nothing is written twice and the producer is not uncertain."""
    leader = ScriptedLeader({0: [DUPLICATE_SEQUENCE]}, lose={0})
    producer, _ = _producer(leader, pid=10, known=True)

    def reconnect(node: int) -> ScriptedLeader:
        leader.broken = False  # a new connection to the node works
        return leader

    producer.cluster.connection = reconnect  # type: ignore[method-assign]
    _send(producer)
    assert leader.events[:2] == [("send", [0]), ("send", [1])] and ("lost", [0]) in leader.events
    sends = [i for kind, batch in leader.events if kind == "send" for i in batch]
    assert sends[:3] == [0, 1, 2] and sends[3] == 0  # in order again, from the lost one
    assert not producer.uncertain and producer.core.partition("t", 0).clean


def test_a_connection_broken_at_a_send_takes_back_the_node_s_later_requests_unsent():
    """Three pipelined requests handed out for one node; the connection breaks under the
    second: the first and second go again with an unknown outcome, the third was never
    sent; all three go again in sequence order, none is answered twice."""
    leader = ScriptedLeader({}, break_send={1})
    producer, _ = _producer(leader, pid=12, known=True)

    def reconnect(node: int) -> ScriptedLeader:
        leader.broken = False
        return leader

    producer.cluster.connection = reconnect  # type: ignore[method-assign]
    _send(producer)
    assert leader.events[:2] == [("send", [0]), ("broke at send", [])]
    sends = [i for kind, batch in leader.events if kind == "send" for i in batch]
    assert sends == [0, 0, 1, 2]
    assert producer.core.partition("t", 0).clean and not producer.uncertain


def test_a_refused_batch_stops_the_call_and_gives_back_the_sequences_never_sent():
    """MESSAGE_TOO_LARGE is not retriable: nothing more goes, the answers due are read, the
    call fails naming the partition; batches never sent give their sequences back, and the
    idempotent producer must take a new producer id (RESET) before its next records."""
    behind = {i: [OUT_OF_ORDER_SEQUENCE] for i in range(2, 7)}  # a gap: the broker refuses
    leader = ScriptedLeader({1: [MESSAGE_TOO_LARGE], **behind})
    producer, _ = _producer(leader, pid=11, known=True)
    with pytest.raises(WireError, match=r"Produce to t\[0\]: MESSAGE_TOO_LARGE"):
        _send(producer, n=8)
    p = producer.core.partition("t", 0)
    sent = [i for kind, batch in leader.events if kind == "send" for i in batch]
    assert sent == list(range(6))  # five in flight; one more after the first was answered
    assert not p.in_flight and p.refused is not None and p.acked == 10
    assert p.next_seq == 60  # batches 6 and 7 were never sent: their sequences came back
    assert producer.state is ProducerState.RESET
    assert not producer.uncertain


def test_concurrent_transactions_is_polled_at_a_short_fixed_interval():
    """The previous transaction's markers end on the broker's time: a doubling backoff (to
    1 s) overshot their end by up to a second per task."""
    from connectors.kafka.wire import producer as wire_producer

    clock = Clock()
    cluster = Cluster(Settings.of({"bootstrap.servers": "127.0.0.1:1"}), clock=clock,
                      sleep=clock.sleep)
    producer = WireProducer(cluster, Settings.of({"bootstrap.servers": "127.0.0.1:1"}), "t",
                            "test", 30.0)
    answers = iter([wire_producer.CONCURRENT_TRANSACTIONS] * 8 + [0])

    def ask() -> str:
        code = next(answers)
        if code:
            raise WireError("busy", code)
        return "done"

    assert producer.retrying(ask, "InitProducerId", 30.0) == "done"
    assert len(clock.pauses) == 8 and max(clock.pauses) <= wire_producer.CONCURRENT_POLL
