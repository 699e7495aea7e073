"""Batch produce: a whole Arrow batch handed to librdkafka in one call (docs/design.md).

confluent-kafka's ``produce()`` costs about a microsecond of Python per record, as much as
everything else the sink does per record together. librdkafka has a batch call,
``rd_kafka_produce_batch``, that confluent-kafka does not expose. This module calls it on the
*same* client, through ctypes and the librdkafka that confluent-kafka itself loaded, with
the message array built by numpy straight from the Arrow buffers: no Python object per
record (the measured gain is in docs/kafka-sink.md, "Batch produce").

Used only where nothing is lost by it:

- the transactional mode without per-record headers (``rd_kafka_produce_batch`` takes none).
  Its delivery reports carry no confluent-kafka state, so the client's ``on_delivery`` is
  not called for them; a failed delivery still fails the task, because librdkafka refuses
  ``commit_transaction`` when any record of the transaction failed delivery ("N message(s)
  failed delivery"), and the task then aborts;
- the recovery-key mode, through :func:`produce_keyed`: a loop in C (the optional
  extension ``_keyed_produce``, built at install time where a C compiler is) that calls
  ``rd_kafka_produceva`` with each record's recovery-key header. Every record carries
  confluent-kafka's own per-message state, so its delivery reports reach the sink's
  ``on_delivery`` exactly as ``produce()``'s do, and a failed delivery fails the task;
- when :func:`handle` confirms the client's handle (a CPython build, confluent-kafka's
  ``Handle`` layout, and librdkafka's own opaque pointing back at the client). Otherwise,
  and with option ``batchProduce=false``, the sink produces record by record.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import platform
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from connectors.core.errors import KafkaSinkError
from connectors.kafka.common import FAMILY

log = logging.getLogger(__name__)

_MSG_F_COPY = 0x2  # librdkafka copies the payload: the Arrow buffers may go right after
_MSG_F_PARTITION = 0x8  # each message's own partition field
_PARTITION_UA = -1
_ERR_QUEUE_FULL = -184  # RD_KAFKA_RESP_ERR__QUEUE_FULL

#: ``rd_kafka_message_t`` (rdkafka.h) on a 64-bit platform.
MESSAGE = np.dtype([
    ("err", "<i4"), ("_pad0", "<i4"), ("rkt", "<u8"), ("partition", "<i4"), ("_pad1", "<i4"),
    ("payload", "<u8"), ("len", "<u8"), ("key", "<u8"), ("key_len", "<u8"),
    ("offset", "<i8"), ("private", "<u8"),
])

#: Records per ``rd_kafka_produce_batch`` call: small enough that a full queue is noticed
#: early, large enough that the call overhead vanishes.
CHUNK = 16_384

# A non-null pointer for empty (not null) keys and values when Arrow has no data buffer.
_EMPTY = ctypes.create_string_buffer(1)


@functools.cache
def _library() -> Any | None:
    """librdkafka, as confluent-kafka loaded it (None: not usable here)."""
    if platform.python_implementation() != "CPython" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    try:
        from confluent_kafka import cimpl

        lib = ctypes.CDLL(cimpl.__file__)  # its symbols and its librdkafka's
        lib.rd_kafka_opaque.restype = ctypes.c_void_p
        lib.rd_kafka_opaque.argtypes = [ctypes.c_void_p]
        lib.rd_kafka_type.restype = ctypes.c_int
        lib.rd_kafka_type.argtypes = [ctypes.c_void_p]
        lib.rd_kafka_topic_new.restype = ctypes.c_void_p
        lib.rd_kafka_topic_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        lib.rd_kafka_topic_destroy.restype = None
        lib.rd_kafka_topic_destroy.argtypes = [ctypes.c_void_p]
        lib.rd_kafka_produce_batch.restype = ctypes.c_int
        lib.rd_kafka_produce_batch.argtypes = [
            ctypes.c_void_p, ctypes.c_int32, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        lib.rd_kafka_err2str.restype = ctypes.c_char_p
        lib.rd_kafka_err2str.argtypes = [ctypes.c_int]
        return lib
    except (ImportError, OSError, AttributeError) as e:
        log.debug("%s: batch produce not available: %s", FAMILY, e)
        return None


@functools.cache
def _keyed() -> tuple[Any, tuple[int, int, int]] | None:
    """The C loop of :func:`produce_keyed` and the librdkafka functions it calls (None: the
    extension was not built here, or batch produce is not available at all)."""
    lib = _library()
    if lib is None:
        return None
    try:
        import confluent_kafka

        from connectors.kafka.sink import _keyed_produce  # type: ignore[attr-defined]
    except ImportError as e:
        log.debug("%s: keyed batch produce not available: %s", FAMILY, e)
        return None
    # The C loop allocates confluent-kafka's per-message state itself: a layout read from
    # its 2.x sources ({Handle *self, PyObject *dr_cb}). Another major version may change
    # it, so the record-by-record loop runs there until it is checked.
    version = str(getattr(confluent_kafka, "__version__", ""))
    if version.split(".", 1)[0] != "2":
        log.debug("%s: keyed batch produce not checked with confluent-kafka %s", FAMILY,
                  version)
        return None
    try:
        lib.rd_kafka_produceva.restype = ctypes.c_void_p
        functions = tuple(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0 for name in
                          ("rd_kafka_produceva", "rd_kafka_error_code", "rd_kafka_error_destroy"))
    except AttributeError as e:  # a librdkafka older than produceva (1.4)
        log.debug("%s: keyed batch produce not available: %s", FAMILY, e)
        return None
    if not all(functions):
        return None
    return _keyed_produce, functions  # type: ignore[return-value]


def keyed_available() -> bool:
    """Whether :func:`produce_keyed` can run here."""
    return _keyed() is not None


def handle(producer: Any) -> int | None:
    """The ``rd_kafka_t *`` of a confluent-kafka ``Producer``, or None when it cannot be
    confirmed. confluent-kafka's ``Handle`` struct holds it right after the object header;
    librdkafka's opaque of that handle is the Python object itself, which confirms it."""
    lib = _library()
    if lib is None:
        return None
    from confluent_kafka import Producer

    if not isinstance(producer, Producer):
        return None
    rk = ctypes.c_void_p.from_address(id(producer) + object.__basicsize__).value
    if not rk or lib.rd_kafka_opaque(rk) != id(producer) or lib.rd_kafka_type(rk) != 0:
        log.debug("%s: batch produce not available: unexpected client layout", FAMILY)
        return None
    return int(rk)


class BinaryColumn:
    """Where a binary Arrow array's values are: ``at(rows)`` gives their addresses and
    lengths (0 and 0 for a null), read from the offsets buffer in place (zero-copy)."""

    def __init__(self, array: pa.Array | pa.ChunkedArray | None, n: int) -> None:
        self.offsets: np.ndarray | None = None
        if array is None or array.null_count == n:
            return
        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        width = np.int64 if pa.types.is_large_binary(array.type) else np.int32
        _, offsets_buf, data_buf = array.buffers()
        self.offsets = np.frombuffer(offsets_buf, dtype=width,
                                     count=array.offset + n + 1)[array.offset:]
        self.base = np.uint64(data_buf.address if data_buf is not None and data_buf.size
                              else ctypes.addressof(_EMPTY))
        self.valid = (array.is_valid().to_numpy(zero_copy_only=False) if array.null_count
                      else None)
        self.array = array  # keeps the buffers alive

    def at(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.offsets is None:
            zeros = np.zeros(len(rows), dtype=np.uint64)
            return zeros, zeros
        starts = self.offsets[rows]
        addresses = self.base + starts.astype(np.uint64)
        lengths = (self.offsets[rows + 1] - starts).astype(np.uint64)
        if self.valid is not None:
            valid = self.valid[rows]
            addresses = np.where(valid, addresses, np.uint64(0))
            lengths = np.where(valid, lengths, np.uint64(0))
        return addresses, lengths


@contextlib.contextmanager
def _topic(lib: Any, rk: int, topic: str) -> Iterator[int]:
    """librdkafka's topic handle for ``topic`` on client ``rk``, for the ``with`` block."""
    rkt = lib.rd_kafka_topic_new(rk, topic.encode(), None)
    if not rkt:
        raise KafkaSinkError(f"{FAMILY}: cannot open topic {topic!r} for batch produce")
    try:
        yield rkt
    finally:
        lib.rd_kafka_topic_destroy(rkt)


def _enqueue_failed(lib: Any, topic: str, partition: int, err: int) -> KafkaSinkError:
    return KafkaSinkError(
        f"{FAMILY}: enqueueing a record for {topic}[{partition}] failed: "
        f"{lib.rd_kafka_err2str(err).decode(errors='replace')} (librdkafka error {err})")


def produce(
    rk: int,
    topic: str,
    values: pa.Array,
    keys: pa.Array | None,
    partitions: np.ndarray,
    order: np.ndarray,
    wait: Callable[[], None],
) -> int:
    """Enqueue rows ``order`` of ``values``/``keys`` to ``topic``, row i to ``partitions[i]``,
    in that order, with ``rd_kafka_produce_batch`` on the client ``rk`` (from :func:`handle`);
    returns the number enqueued. On a full
    queue it calls ``wait`` (which serves the client) and goes on where it stopped; any other
    enqueue error raises :class:`KafkaSinkError`, naming the topic and partition."""
    lib = _library()
    if lib is None:
        raise KafkaSinkError(f"{FAMILY}: batch produce is not available (internal)")
    n = len(order)
    if n == 0:
        return 0
    value_col, key_col = BinaryColumn(values, len(values)), BinaryColumn(keys, len(values))
    # One message array of at most CHUNK records, refilled: memory stays flat in the task.
    messages = np.zeros(min(CHUNK, n), dtype=MESSAGE)
    with _topic(lib, rk, topic) as rkt:
        for first in range(0, n, CHUNK):
            rows = order[first:first + CHUNK]
            chunk = messages[:len(rows)]
            chunk["payload"], chunk["len"] = value_col.at(rows)
            chunk["key"], chunk["key_len"] = key_col.at(rows)
            chunk["partition"] = partitions[rows]
            _enqueue(lib, rkt, chunk, topic, wait)
    return n


def _enqueue(lib: Any, rkt: int, chunk: np.ndarray, topic: str,
             wait: Callable[[], None]) -> None:
    """``rd_kafka_produce_batch`` until every message of ``chunk`` is queued."""
    done, n, size = 0, len(chunk), MESSAGE.itemsize
    start = chunk.ctypes.data
    while done < n:
        chunk["err"][done:] = 0  # librdkafka sets them again; no stale QUEUE_FULL counts
        good = lib.rd_kafka_produce_batch(
            rkt, _PARTITION_UA, _MSG_F_COPY | _MSG_F_PARTITION, start + done * size, n - done)
        if good == n - done:
            return
        errors = chunk["err"][done:]
        first = int(np.flatnonzero(errors)[0])
        err = int(errors[first])
        done += first
        if err != _ERR_QUEUE_FULL:
            raise _enqueue_failed(lib, topic, int(chunk["partition"][done]), err)
        wait()


def produce_keyed(
    producer: Any,
    on_delivery: Callable[[Any, Any], None],
    rk: int,
    topic: str,
    values: pa.Array,
    keys: pa.Array | None,
    partitions: np.ndarray,
    order: np.ndarray,
    header: str,
    prefix: bytes,
    wait: Callable[[], None],
) -> int:
    """:func:`produce` for the recovery-key mode: row i also gets the header ``header`` with
    the value ``prefix`` + i as 8 big-endian bytes (its seq), and its delivery report goes to
    ``on_delivery`` like a ``producer.produce(..., on_delivery=...)`` record's. Needs
    :func:`keyed_available`."""
    keyed, lib = _keyed(), _library()
    if keyed is None or lib is None:
        raise KafkaSinkError(f"{FAMILY}: keyed batch produce is not available (internal)")
    module, (produceva, error_code, error_destroy) = keyed
    n = len(order)
    if n == 0:
        return 0
    value_col, key_col = BinaryColumn(values, len(values)), BinaryColumn(keys, len(values))
    name = header.encode()
    with _topic(lib, rk, topic) as rkt:
        for first in range(0, n, CHUNK):
            rows = order[first:first + CHUNK]
            value_at, value_len = (np.ascontiguousarray(a, np.uint64) for a in value_col.at(rows))
            key_at, key_len = (np.ascontiguousarray(a, np.uint64) for a in key_col.at(rows))
            parts = np.ascontiguousarray(partitions[rows], np.int32)
            seqs = np.ascontiguousarray(rows, np.uint64)
            done, m = 0, len(rows)
            while done < m:
                queued, err = module.produce(
                    producer, on_delivery, produceva, error_code, error_destroy, rk, rkt,
                    m - done, value_at.ctypes.data + 8 * done, value_len.ctypes.data + 8 * done,
                    key_at.ctypes.data + 8 * done, key_len.ctypes.data + 8 * done,
                    parts.ctypes.data + 4 * done, seqs.ctypes.data + 8 * done, name, prefix)
                done += queued
                if done == m:
                    break
                if err != _ERR_QUEUE_FULL:
                    raise _enqueue_failed(lib, topic, int(parts[done]), err)
                wait()
    return n
