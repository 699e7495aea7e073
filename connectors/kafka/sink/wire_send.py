"""Produce on the wire path: record batches to their leaders, with at most
:data:`MAX_IN_FLIGHT` requests waiting per connection, each batch sent again with its same
producer id, epoch and sequence until it is acknowledged or ``message.timeout.ms`` passes
(docs/design.md, "The wire client's failures").

One round sends every batch still to go to the leaders the metadata names: a request holds
at most one batch per partition, in sequence order, so at most five batches of a partition
are ever in flight, the number a broker remembers per producer and partition to recognise a
duplicate. Each answer is read by its correlation id. Then, per batch:

- acknowledged, or ``DUPLICATE_SEQUENCE_NUMBER`` (the broker has it from an earlier send):
  done;
- a retriable answer (a leader moved, ``REQUEST_TIMED_OUT``, ``NOT_ENOUGH_REPLICAS``...),
  or ``OUT_OF_ORDER_SEQUENCE_NUMBER`` behind one: sent again next round;
- the connection lost before the answer (a reset, a timeout, a broker killed): the outcome is
  unknown, so the batch and every later one on that connection go again next round with
  their same sequences; whichever copy reaches the broker second is dropped there;
- anything else fails the task, once every answer still due on every connection has come
  (nothing of this attempt stays in flight behind the failure).

Between rounds: a backoff (``retry.backoff.ms``), then the leaders are asked again from any
live broker.

A partition's later batches wait until its first one is acknowledged while the broker may not
know the producer id there (nothing of it acknowledged in this process yet: a new topic, a
new sink, a restarted worker). A broker takes any sequence from a producer id it does not
know, so if the first batch were refused for now (``NOT_LEADER_OR_FOLLOWER`` from a node
about to become the leader) and the second taken, the first could never be appended:
``OUT_OF_ORDER_SEQUENCE_NUMBER``, and the task fails. Measured on the 3-node cluster: every
first write into a new 1,000-partition topic failed that way. Once the broker knows the
producer id, a gap is refused and sent again as above, so pipelining resumes.
"""

from __future__ import annotations

import logging
import struct
import time
from collections import deque
from collections.abc import Iterator
from typing import Protocol

import numpy as np

from connectors.kafka.sink.wire_encode import MAX_REQUEST_BYTES
from connectors.kafka.wire import flexible
from connectors.kafka.wire.protocol import (
    DUPLICATE_SEQUENCE,
    ERRORS,
    NETWORK_EXCEPTION,
    OUT_OF_ORDER_SEQUENCE,
    PRODUCE,
    RETRIABLE,
    TV2_VERSIONS,
    VERSIONS,
    Connection,
    ConnectionLost,
    WireError,
    _Reader,
    string,
)
from connectors.kafka.wire.settings import Settings


class Producing(Protocol):
    """What a :class:`Sender` needs of the producer it sends for (the sink's
    ``wire.WireProducer``): its ids and settings, the leaders it knows, its connections,
    and its error check."""

    settings: Settings
    who: str
    transactional_id: str | None
    producer_id: int
    tv2: bool | None
    uncertain: bool
    leaders: dict[str, np.ndarray]

    def connection(self, node: int) -> Connection: ...

    def refresh(self, topic: str, partitions: int = 0) -> None: ...

    def backoff(self, attempt: int, reconnect: bool = False) -> float: ...

    def check(self, code: int, request: str, coordinator: bool = False) -> None: ...

log = logging.getLogger(__name__)

#: Requests a connection may have waiting (Java's and librdkafka's cap for an idempotent
#: producer): with one batch per partition per request, at most five batches of a
#: partition are in flight, all within the broker's duplicate window.
MAX_IN_FLIGHT = 5

Batch = tuple[int, int, int]  # partition, start and end in the encoded bytes
Request = list[Batch]

#: (producer id, topic, partition) with a batch acknowledged in this process: the broker
#: knows the producer id there and refuses a gap in its sequences.
_KNOWN: set[tuple[int, str, int]] = set()
_KNOWN_MAX = 1_000_000


class Sender:
    """The batches of one ``WireProducer.produce`` call, sent until each is settled."""

    def __init__(self, producer: Producing, topic: str, partition_count: int,
                 view: memoryview) -> None:
        self.producer = producer
        self.topic = topic
        self.partition_count = partition_count
        self.view = view
        timeout_ms = int(producer.settings.request_timeout * 1000)
        #: Produce v12 under transactions v2: each partition joins the transaction with it.
        self.v2 = bool(producer.tv2)
        self.version = TV2_VERSIONS[PRODUCE] if self.v2 else VERSIONS[PRODUCE]
        if self.v2:
            self.head = flexible.produce_head(producer.transactional_id, timeout_ms, topic)
        else:
            self.head = string(producer.transactional_id) + struct.pack(
                ">hii", -1, timeout_ms, 1) + string(topic)

    def run(self, batches: list[Batch]) -> None:
        """Send ``batches`` (in sequence order per partition) until every one is
        acknowledged; raise when one is refused or ``message.timeout.ms`` passes."""
        p = self.producer
        deadline = time.monotonic() + p.settings.delivery_timeout
        todo = batches
        attempt = 0
        while True:
            failed, unknown = self.round(todo)
            if not failed:
                return
            codes = sorted({code for _, code in failed})
            pause = p.backoff(attempt, reconnect=NETWORK_EXCEPTION in codes)
            if time.monotonic() + pause > deadline:
                p.uncertain = p.uncertain or unknown
                raise WireError(
                    f"{p.who}: Produce to {self.topic!r} still failing after "
                    f"{p.settings.delivery_timeout:.0f}s (message.timeout.ms): "
                    f"{self.describe(failed)}", codes[0])
            log.info("%s: Produce to %r: %s; sending again", p.who, self.topic,
                     self.describe(failed))
            time.sleep(pause)
            attempt += 1
            p.refresh(self.topic, self.partition_count)
            todo = sorted((batch for batch, _ in failed), key=lambda b: (b[0], b[1]))

    def describe(self, failed: list[tuple[Batch, int]]) -> str:
        names = sorted({ERRORS.get(code, str(code)) for _, code in failed})
        return f"{len(failed)} batches, {', '.join(names)}"

    def plan(self, batches: list[Batch]) -> dict[int, deque[Request]]:
        """Requests per leader: at most one batch per partition each, in sequence order,
        at most MAX_REQUEST_BYTES."""
        leaders = self.producer.leaders[self.topic]
        queues: dict[int, list[tuple[Request, list[int]]]] = {}
        after: dict[int, int] = {}  # partition -> the first request its next batch may join
        for batch in batches:
            part, size = batch[0], batch[2] - batch[1]
            queue = queues.setdefault(int(leaders[part]), [])
            j = after.get(part, 0)
            while j < len(queue) and queue[j][1][0] + size > MAX_REQUEST_BYTES:
                j += 1
            if j == len(queue):
                queue.append(([], [0]))
            queue[j][0].append(batch)
            queue[j][1][0] += size
            after[part] = j + 1
        return {node: deque(r for r, _ in q) for node, q in queues.items()}

    def round(self, batches: list[Batch]) -> tuple[list[tuple[Batch, int]], bool]:
        """One round: ``(batches to send again with their codes, whether any outcome is
        unknown)``. Raises a refusal only once no answer is due on any connection."""
        queues = self.plan(batches)
        flight: dict[int, deque[tuple[int, Request]]] = {node: deque() for node in queues}
        conns: dict[int, Connection] = {}
        failed: list[tuple[Batch, int]] = []
        behind: set[int] = set()  # partitions with a batch to send again: later ones follow
        refused: WireError | None = None
        unknown = False

        def give_up(node: int, code: int) -> None:
            """Everything of ``node`` not yet answered goes again next round."""
            for _, request in flight[node]:
                failed.extend((b, code) for b in request)
                behind.update(b[0] for b in request)
                for b in request:
                    sent[b[0]] -= 1
            for request in queues[node]:
                failed.extend((b, code) for b in request)
                behind.update(b[0] for b in request)
            flight[node].clear()
            queues[node].clear()

        sent: dict[int, int] = {}  # partition -> its batches in flight

        def may_send(request: Request) -> bool:
            pid = self.producer.producer_id
            return all(not sent.get(b[0]) or (pid, self.topic, b[0]) in _KNOWN
                       for b in request)

        while any(queues.values()) or any(flight.values()):
            for node, queue in queues.items():
                while queue and refused is None and len(flight[node]) < MAX_IN_FLIGHT:
                    request = self.next_request(queue, behind, failed)
                    if request is None:
                        continue
                    if not may_send(request):
                        break
                    try:
                        conn = conns.get(node)
                        if conn is None or conn.broken:
                            conn = conns[node] = self.producer.connection(node)
                        flight[node].append((conn.send(PRODUCE, self.parts(request),
                                                          self.version), request))
                        queue.popleft()
                        for b in request:
                            sent[b[0]] = sent.get(b[0], 0) + 1
                    except ConnectionLost:
                        unknown = True
                        give_up(node, NETWORK_EXCEPTION)
                    except WireError as e:  # cannot connect: nothing of it was sent
                        if e.code not in RETRIABLE:
                            raise
                        give_up(node, e.code)
                if refused is not None:
                    queue.clear()
            for node, waiting in flight.items():
                if not waiting:
                    continue
                correlation, request = waiting.popleft()
                try:
                    answer = conns[node].receive(correlation)
                except ConnectionLost:
                    unknown = True
                    waiting.appendleft((correlation, request))
                    give_up(node, NETWORK_EXCEPTION)
                    continue
                for b in request:
                    sent[b[0]] -= 1
                refused = self.answers(answer, request, failed, behind) or refused
        if refused is not None:
            self.producer.uncertain = self.producer.uncertain or unknown
            raise refused
        return failed, unknown

    def parts(self, request: Request) -> list[bytes | memoryview]:
        if self.v2:
            return flexible.produce_parts(self.head, request, self.view)
        out: list[bytes | memoryview] = [self.head + struct.pack(">i", len(request))]
        for part, a, b in request:
            out.append(struct.pack(">ii", part, b - a))
            out.append(self.view[a:b])
        return out

    @staticmethod
    def next_request(queue: deque[Request], behind: set[int],
                     failed: list[tuple[Batch, int]]) -> Request | None:
        """The next request of ``queue`` without the batches of partitions that have an
        earlier batch to send again (they follow it next round: sent now, an unknown
        producer id's would be appended before it); None when nothing of it is left."""
        request = queue[0]
        if behind.isdisjoint(b[0] for b in request):
            return request
        failed.extend((b, OUT_OF_ORDER_SEQUENCE) for b in request if b[0] in behind)
        request = [b for b in request if b[0] not in behind]
        if request:
            queue[0] = request
            return request
        queue.popleft()
        return None

    def known(self, partition: int) -> None:
        if len(_KNOWN) >= _KNOWN_MAX:
            _KNOWN.clear()  # bounded: at worst the next writes wait once more
        _KNOWN.add((self.producer.producer_id, self.topic, partition))

    def answers(self, r: _Reader, request: Request, failed: list[tuple[Batch, int]],
                behind: set[int]) -> WireError | None:
        """Read one Produce answer; the first refusal in it (None: none)."""
        by_partition = {b[0]: b for b in request}
        refused: WireError | None = None
        for part, code in (flexible.produce_answers(r) if self.v2 else _answers(r)):
            if code in (0, DUPLICATE_SEQUENCE):
                self.known(part)
                continue
            if code in RETRIABLE or (code == OUT_OF_ORDER_SEQUENCE and part in behind):
                behind.add(part)
                failed.append((by_partition[part], code))
            elif refused is None:
                try:
                    self.producer.check(code, f"Produce to {self.topic}[{part}]")
                except WireError as e:
                    refused = e
        return refused


def _answers(r: _Reader) -> Iterator[tuple[int, int]]:
    """A Produce v7 answer: each partition's (index, error code)."""
    for _ in range(r.take(">i")):
        r.string()
        for _ in range(r.take(">i")):
            part, code = r.take(">ih")
            r.at += 24  # base offset, log append time, log start offset
            yield part, code
    r.take(">i")  # throttle
