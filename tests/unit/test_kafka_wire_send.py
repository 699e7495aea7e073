"""The wire path's Produce rounds (``wire_send.Sender``) against a scripted leader: which
batches go out before which answers, and what is sent again."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import numpy as np
import pytest

from connectors.kafka.sink import wire_send
from connectors.kafka.wire.protocol import (
    OUT_OF_ORDER_SEQUENCE,
    _Reader,
    compact,
    string,
    uvarint,
)

NOT_LEADER_OR_FOLLOWER = 6


class ScriptedLeader:
    """One leader's connection. Batch ``i`` of the test is 10 bytes starting with byte
    ``i``; ``codes[i]`` is the answer its first send gets (default: acknowledged). Records
    what was sent and answered, in order. Speaks Produce v7, or v12 (flexible) when the
    request is."""

    def __init__(self, codes: dict[int, int]) -> None:
        self.codes = codes
        self.events: list[tuple[str, list[int]]] = []
        self.requests: dict[int, list[tuple[int, int]]] = {}
        self.broken = False
        self.versions: set[int] = set()

    def send(self, api: int, parts: list, version: int) -> int:
        self.versions.add(version)
        if version >= 9:  # [partition, uvarint size + 1] records [no tags], ... + 2 tags
            count = bytes(parts[0])[-1] - 1
            assert bytes(parts[-1]) == b"\x00\x00"
            batches = [(struct.unpack_from(">i", bytes(parts[1 + 3 * i]))[0],
                        parts[2 + 3 * i][0]) for i in range(count)]
            assert all(bytes(parts[3 + 3 * i]) == b"\x00" for i in range(count))
        else:
            count = struct.unpack(">i", bytes(parts[0])[-4:])[0]
            batches = [(struct.unpack(">ii", bytes(parts[1 + 2 * i]))[0], parts[2 + 2 * i][0])
                       for i in range(count)]
        correlation = len(self.requests)
        self.requests[correlation] = batches
        self.events.append(("send", [i for _, i in batches]))
        return correlation

    def receive(self, correlation: int) -> _Reader:
        batches = self.requests[correlation]
        self.events.append(("answer", [i for _, i in batches]))
        if 12 in self.versions:  # record errors, an error message and a current leader
            body = uvarint(2) + compact("t") + uvarint(len(batches) + 1)
            for part, i in batches:
                code = self.codes.pop(i, 0)
                body += (struct.pack(">ih", part, code) + bytes(24)
                         + uvarint(2) + struct.pack(">i", 0) + compact("bad") + b"\x00"
                         + compact("why" if code else None)
                         + b"\x01\x00\x08" + struct.pack(">ii", 2, 5))
            return _Reader(body + b"\x00" + struct.pack(">i", 0) + b"\x00")
        body = struct.pack(">i", 1) + string("t") + struct.pack(">i", len(batches))
        for part, i in batches:
            body += struct.pack(">ih", part, self.codes.pop(i, 0)) + bytes(24)
        return _Reader(body + struct.pack(">i", 0))


def _round(pid: int, codes: dict[int, int], n: int = 3, tv2: bool = False):
    """One round of ``n`` batches of partition 0 (in sequence order) to one leader."""
    data = bytearray(10 * n)
    for i in range(n):
        data[10 * i] = i
    leader = ScriptedLeader(codes)
    producer = SimpleNamespace(
        settings=SimpleNamespace(request_timeout=30.0, delivery_timeout=300.0),
        transactional_id="tx" if tv2 else None, producer_id=pid, who="test", uncertain=False,
        tv2=tv2,
        leaders={"t": np.zeros(4, dtype=np.int32)}, connection=lambda node: leader)
    sender = wire_send.Sender(producer, "t", 4, memoryview(data))  # type: ignore[arg-type]
    failed, unknown = sender.round([(0, 10 * i, 10 * i + 10) for i in range(n)])
    return leader.events, sorted(data[b[1]] for b, _ in failed), unknown


@pytest.fixture(autouse=True)
def _forget():
    wire_send._KNOWN.clear()
    yield
    wire_send._KNOWN.clear()


@pytest.mark.parametrize("tv2", [False, True], ids=["produce-v7", "produce-v12"])
def test_a_partition_new_to_the_producer_id_waits_for_its_first_batch(tv2):
    """The broker takes any sequence from a producer id it does not know: the second batch
    goes only once the first is acknowledged. Then pipelining resumes."""
    events, failed, _ = _round(pid=7, codes={}, tv2=tv2)
    assert events[:3] == [("send", [0]), ("answer", [0]), ("send", [1])]
    assert failed == []
    events, _, _ = _round(pid=7, codes={}, tv2=tv2)
    assert events[:3] == [("send", [0]), ("send", [1]), ("send", [2])]


def test_a_first_batch_refused_for_now_takes_the_later_ones_back_unsent():
    """NOT_LEADER_OR_FOLLOWER from a node about to become the leader: had the second batch
    gone and been taken, the first could never be appended (OUT_OF_ORDER_SEQUENCE_NUMBER,
    what the 3-node cluster answered on every first write into a new topic)."""
    events, failed, unknown = _round(pid=8, codes={0: NOT_LEADER_OR_FOLLOWER})
    assert events == [("send", [0]), ("answer", [0])]
    assert failed == [0, 1, 2] and not unknown


@pytest.mark.parametrize("tv2", [False, True], ids=["produce-v7", "produce-v12"])
def test_a_known_producer_id_pipelines_and_sends_a_gap_again(tv2):
    """Where the broker knows the producer id it refuses a gap, so later batches may be in
    flight; an OUT_OF_ORDER_SEQUENCE_NUMBER behind a refused batch goes again with it."""
    wire_send._KNOWN.add((9, "t", 0))
    events, failed, _ = _round(pid=9, codes={0: NOT_LEADER_OR_FOLLOWER,
                                             1: OUT_OF_ORDER_SEQUENCE,
                                             2: OUT_OF_ORDER_SEQUENCE}, tv2=tv2)
    assert events[:3] == [("send", [0]), ("send", [1]), ("send", [2])]
    assert failed == [0, 1, 2]


def test_concurrent_transactions_is_polled_at_a_short_fixed_interval(monkeypatch):
    """The previous transaction's markers end on the broker's time: a doubling backoff (to
    1 s) overshot their end by up to a second per task."""
    from connectors.kafka.sink import wire
    from connectors.kafka.wire.protocol import WireError
    from connectors.kafka.wire.settings import Settings

    producer = wire.WireProducer(Settings.of({"bootstrap.servers": "127.0.0.1:1"}), "t", "test",
                                 30.0)
    pauses: list[float] = []
    from connectors.kafka.wire import cluster

    monkeypatch.setattr(cluster.time, "sleep", pauses.append)
    answers = iter([wire.CONCURRENT_TRANSACTIONS] * 8 + [0])

    def ask() -> str:
        code = next(answers)
        if code:
            raise WireError("busy", code)
        return "done"

    assert producer.retrying(ask, "InitProducerId", 30.0) == "done"
    assert len(pauses) == 8 and max(pauses) <= wire.CONCURRENT_POLL
