"""Produce requests of one topic on the wire, until every batch the producer holds for it is
settled (docs/design.md, "The wire client's failures").

The :class:`Sender` only moves bytes. What may go, to which node, in which request, and what
each answer means are the producer's state (:class:`connectors.kafka.wire.state.Producer`
and its :class:`~connectors.kafka.wire.partition.PartitionState`\\ s); the sender asks it
for requests, sends them on the cluster's connections, reads each answer by its correlation
id and reports it back:

- acknowledged, or ``DUPLICATE_SEQUENCE_NUMBER``: the batch is done;
- a retriable answer (a leader moved, ``REQUEST_TIMED_OUT``, ``NOT_ENOUGH_REPLICAS``...),
  or ``OUT_OF_ORDER_SEQUENCE_NUMBER`` behind one: sent again, same bytes, after a backoff
  and fresh leaders;
- the connection lost before the answer (a reset, a timeout, a broker killed): every batch
  in flight on it goes again, same bytes, its outcome unknown until answered;
- anything else refuses the batch: nothing more is sent, every answer still due is read
  (nothing of this call stays in flight behind the failure), and the call fails.

A batch is sent again until ``message.timeout.ms`` has passed since the call began; then the
answers due are read and the call fails, the producer uncertain where a lost connection's
outcome stayed unknown.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable

from connectors.kafka.wire import requests
from connectors.kafka.wire.cluster import Cluster
from connectors.kafka.wire.partition import Batch, SequenceError
from connectors.kafka.wire.protocol import (
    ERRORS,
    NETWORK_EXCEPTION,
    PRODUCE,
    RETRIABLE,
    TV2_VERSIONS,
    VERSIONS,
    Connection,
    ConnectionLost,
    Reader,
    WireError,
)
from connectors.kafka.wire.settings import Settings
from connectors.kafka.wire.state import Producer

log = logging.getLogger(__name__)


class Sender:
    """The Produce requests of one ``WireProducer.produce`` call, to ``topic``, for the
    producer ``core`` over ``cluster``'s connections. ``error(code, request)`` is the
    refusal to raise for an error answer; ``timeout`` bounds a metadata request
    (``metadataRetryTimeout``)."""

    def __init__(self, core: Producer, cluster: Cluster, settings: Settings, topic: str, *,
                 who: str, timeout: float, error: Callable[[int, str], WireError]) -> None:
        self.core = core
        self.cluster = cluster
        self.settings = settings
        self.topic = topic
        self.who = who
        self.timeout = timeout
        self.error = error
        timeout_ms = int(settings.request_timeout * 1000)
        txn = self.core.transactional_id
        #: Produce v12 under transactions v2: each partition joins the transaction with it.
        self.v2 = bool(self.core.tv2)
        if self.v2:
            self.version = TV2_VERSIONS[PRODUCE]
            self.head = requests.produce_head_v12(txn, timeout_ms, topic)
        else:
            self.version = VERSIONS[PRODUCE]
            self.head = requests.produce_head_v7(txn, timeout_ms, topic)
        #: Requests in flight per node, in send order: (correlation id, its batches).
        self.flight: dict[int, deque[tuple[int, list[Batch]]]] = {}
        self.conns: dict[int, Connection] = {}
        #: Retriable answers met, by error code (for the deadline's message).
        self.codes: Counter[int] = Counter()
        #: Connections lost so far (the reconnect backoff doubles).
        self.losses = 0

    def run(self) -> None:
        """Send until every batch of the topic is settled; raise when one is refused, a
        request the sending needs fails for good (fresh metadata, a connection), or
        ``message.timeout.ms`` passes: always once nothing is in flight any more but on lost
        connections."""
        core, clock = self.core, self.cluster.clock
        deadline = clock() + self.settings.delivery_timeout
        failure: WireError | None = None
        while True:
            now = clock()
            going = failure is None and core.refusal(self.topic) is None and now < deadline
            sent = False
            if going:
                try:
                    self.refresh_stale(now)
                    broke: set[int] = set()
                    handed = core.requests(self.topic, clock())
                    for i, (node, batches) in enumerate(handed):
                        # A node whose connection broke in this pass took back every batch
                        # handed out for it (Producer.lost): its later requests stay unsent.
                        later = [b for n, bs in handed[i + 1:] if n == node for b in bs]
                        if node not in broke and not self.send(node, batches, later):
                            broke.add(node)
                        sent = True
                except WireError as e:  # stop sending; what is in flight is still read
                    failure, going = e, False
            if any(self.flight.values()):
                self.receive()
                continue
            if core.settled(self.topic) and failure is None:
                return
            if not going:
                break
            wake = min((p.retry_at for p in core.partitions.values()
                        if p.topic == self.topic and p.queue), default=now)
            pause = min(max(wake - now, 0.0), max(deadline - now, 0.0))
            if pause > 0:
                log.info("%s: Produce to %r: %s; sending again in %.2fs", self.who,
                         self.topic, self.describe(), pause)
                self.cluster.sleep(pause)
            elif not sent:  # nothing in flight, nothing to wait for, nothing sendable
                failure = SequenceError(f"batches of {self.topic!r} are held and nothing "
                                        "can be sent")
        error = failure or core.refusal(self.topic) or WireError(
            f"{self.who}: Produce to {self.topic!r} still failing after "
            f"{self.settings.delivery_timeout:.0f}s (message.timeout.ms): "
            f"{self.describe()}", min(self.codes, default=NETWORK_EXCEPTION))
        core.failed(error)
        raise error

    def refresh_stale(self, now: float) -> None:
        """Fresh leaders for a partition whose batches wait to go again after a leader moved
        or a connection was lost, once its backoff has passed."""
        if any(p.stale and p.queue and p.retry_at <= now for p in self.core.partitions.values()
               if p.topic == self.topic):
            self.cluster.stale(self.topic)
            self.core.take_leaders(self.topic, self.cluster.topic_leaders(
                self.topic, 0, self.who, self.timeout))

    def send(self, node: int, batches: list[Batch], later: list[Batch]) -> bool:
        """Send one request; False when the node's connection broke: every batch handed out
        for the node is back in its queue, those of this request of unknown outcome (its
        bytes may have gone) unless no connection took it, those of ``later`` requests to
        the node (not sent yet) as never sent."""
        try:
            conn = self.conns.get(node)
            if conn is None or conn.broken:
                conn = self.conns[node] = self.cluster.connection(node)
            correlation = conn.send(PRODUCE, self.parts(batches), self.version)
        except ConnectionLost:  # the request's bytes may have gone: its outcome is unknown
            self.lose(node, unsent=later)
            return False
        except WireError as e:  # no connection: nothing of this request was sent
            self.lose(node, unsent=batches + later)
            if e.code not in RETRIABLE:
                raise
            self.codes[e.code] += 1
            return False
        self.flight.setdefault(node, deque()).append((correlation, batches))
        return True

    def receive(self) -> None:
        """The answer of the oldest request of one node, the nodes in turn."""
        node = next(n for n, waiting in self.flight.items() if waiting)
        correlation, batches = self.flight[node].popleft()
        self.flight[node] = self.flight.pop(node)  # to the back: the next node's turn next
        try:
            answer = self.conns[node].receive(correlation)
        except ConnectionLost:
            self.lose(node)
            return
        self.core.finished(node)
        self.answers(node, answer, batches)

    def lose(self, node: int, unsent: list[Batch] | None = None) -> None:
        """The connection to ``node`` broke: every batch in flight on it goes again (the
        request it broke under too), its outcome unknown; ``unsent``: a request that no
        connection took (its batches were never written)."""
        now = self.cluster.clock()
        pause = self.cluster.backoff(self.losses, reconnect=True)
        self.losses += 1
        gone = self.core.lost(node, now, pause, unsent or ())
        self.flight.pop(node, None)
        self.conns.pop(node, None)
        self.codes[NETWORK_EXCEPTION] += 1
        if gone:
            log.info("%s: the connection to broker %d broke under %d batches of %r; they go "
                     "again with their sequences", self.who, node, len(gone),
                     self.topic)

    def answers(self, node: int, r: Reader, batches: list[Batch]) -> None:
        """One Produce answer, batch by batch."""
        core, cluster, now = self.core, self.cluster, self.cluster.clock()
        by_partition = {b.partition: b for b in batches}
        read = requests.read_produce_v12 if self.v2 else requests.read_produce_v7
        for part, code in read(r):
            batch = by_partition[part]
            p = core.partitions[(self.topic, part)]
            pause = cluster.backoff(p.retries)
            error = None
            if code not in RETRIABLE and code:
                error = self.error(code, f"Produce to {self.topic}[{part}]")
            if core.answered(node, batch, code, now, pause, error):
                cluster.learned(core.producer_id, self.topic, part)
            elif p.refused is None:
                self.codes[code] += 1

    def parts(self, batches: list[Batch]) -> list[bytes | memoryview]:
        """The request's parts: each batch's own bytes (never copied, never re-encoded)."""
        encode = requests.produce_parts_v12 if self.v2 else requests.produce_parts_v7
        return encode(self.head, [(b.partition, b.data) for b in batches])

    def describe(self) -> str:
        names = sorted(ERRORS.get(code, str(code)) for code in self.codes)
        waiting = sum(len(p.queue) + len(p.in_flight) for p in self.core.partitions.values()
                      if p.topic == self.topic)
        return f"{waiting} batches, {', '.join(names) or 'no answer'}"

