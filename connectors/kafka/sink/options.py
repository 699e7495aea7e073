"""Options of the ``eo_kafka`` sink: Spark's string options, or the Python API's arguments,
parsed once into a frozen, picklable :class:`KafkaSinkOptions` (docs/kafka-sink.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from connectors.core.errors import OptionError
from connectors.core.options import OptionReader, RedactedDict, check_sink_id
from connectors.core.storage import (
    StorageOptions,
    check_state_path,
    parse_storage_options,
    storage_options_from,
)
from connectors.kafka.common import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_RETRY_TIMEOUT,
    FAMILY,
    seconds_option,
)
from connectors.kafka.sink import recovery
from connectors.kafka.sink.producers import producer_config


@dataclass(frozen=True)
class KafkaSinkOptions:
    """The parsed options of one ``eo_kafka`` sink."""

    sink_id: str
    wal_path: str
    # librdkafka producer settings (PRODUCER_DEFAULTS + kafka.*); repr hides secrets.
    producer_conf: RedactedDict = field(compare=False)
    topic: str | None = None
    deterministic_order: bool = False
    transactional: bool = False
    recovery_key_headers: bool = False
    unsafe: bool = False
    flush_timeout: float = 300.0
    scan_timeout: float = 120.0
    metadata_retry_timeout: float = DEFAULT_RETRY_TIMEOUT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    fail_on_unknown_topic: bool = False
    batch_produce: bool = True
    #: ``storage.*``: how to reach an object store holding ``walPath``
    storage: StorageOptions = field(default_factory=StorageOptions)

    @classmethod
    def create(
        cls,
        sink_id: str,
        wal_path: str,
        *,
        bootstrap_servers: str | None,
        topic: str | None,
        kafka_options: Mapping[str, Any] | None,
        deterministic_order: bool,
        transactional: bool,
        unsafe: bool,
        flush_timeout: float,
        scan_timeout: float,
        metadata_retry_timeout: float = DEFAULT_RETRY_TIMEOUT,
        recovery_key_headers: bool = False,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        fail_on_unknown_topic: bool = False,
        batch_produce: bool = True,
        storage_options: Mapping[str, Any] | StorageOptions | None = None,
    ) -> KafkaSinkOptions:
        """From the Python API's arguments (``KafkaSink(...)``, which has the defaults)."""
        if not sink_id or not str(sink_id).strip():
            raise OptionError(
                f"{FAMILY}: option 'sink_id' is required: a stable name for this sink, unique "
                "per output (it is part of every recovery key and transactional.id)",
                option="sink_id",
            )
        if not wal_path or not str(wal_path).strip():
            raise OptionError(
                f"{FAMILY}: option 'walPath' is required: a directory (local, hdfs://, s3://, "
                "gs:// or abfss://) for the sink's commit log and started markers, stable "
                "across restarts",
                option="walPath",
            )
        storage = storage_options if isinstance(storage_options, StorageOptions) \
            else storage_options_from(storage_options, FAMILY)
        check_state_path(str(wal_path).strip(), storage, FAMILY, "walPath")
        sink_id = check_sink_id(FAMILY, str(sink_id).strip())
        recovery.key_prefix(sink_id, 0, 0)  # validates the sink id's length
        return cls(
            sink_id=sink_id,
            wal_path=str(wal_path).strip(),
            producer_conf=producer_config(kafka_options, bootstrap_servers, unsafe),
            topic=topic.strip() if topic and topic.strip() else None,
            deterministic_order=bool(deterministic_order),
            transactional=bool(transactional),
            recovery_key_headers=bool(recovery_key_headers),
            unsafe=bool(unsafe),
            flush_timeout=_positive(flush_timeout, "flush_timeout"),
            scan_timeout=_positive(scan_timeout, "scan_timeout"),
            metadata_retry_timeout=_positive(metadata_retry_timeout, "metadata_retry_timeout",
                                             zero=True),
            connect_timeout=_positive(connect_timeout, "connect_timeout"),
            fail_on_unknown_topic=bool(fail_on_unknown_topic),
            batch_produce=bool(batch_produce),
            storage=storage,
        )

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> KafkaSinkOptions:
        """From Spark's string options (``writeStream.format("eo_kafka")``)."""
        r = OptionReader(options, family=FAMILY)
        sink_id = r.required("sink_id", "a stable name for this sink, unique per output")
        wal_path = r.required("walPath", "a directory for the sink's commit log and markers")
        servers = r.required("kafka.bootstrap.servers", "the brokers' host:port list")
        parsed = cls.create(
            sink_id,
            wal_path,
            bootstrap_servers=servers,
            topic=r.string("topic"),
            kafka_options=r.prefixed("kafka."),
            deterministic_order=r.boolean("deterministicOrder", False),
            transactional=r.boolean("transactional", False),
            unsafe=r.boolean("unsafe", False),
            flush_timeout=r.duration("flushTimeout", 300.0, minimum=1) or 300.0,
            scan_timeout=r.duration("scanTimeout", 120.0, minimum=1) or 120.0,
            metadata_retry_timeout=seconds_option(r, "metadataRetryTimeout",
                                                  DEFAULT_RETRY_TIMEOUT, 0),
            recovery_key_headers=r.boolean("recoveryKeyHeaders", False),
            connect_timeout=seconds_option(r, "connectTimeout", DEFAULT_CONNECT_TIMEOUT, 0.1),
            fail_on_unknown_topic=r.boolean("failOnUnknownTopic", False),
            batch_produce=r.boolean("batchProduce", True),
            storage_options=parse_storage_options(r),
        )
        r.warn_unknown(prefixes=("kafka.",), ignore=("batchId", "checkpointLocation"))
        return parsed


def _positive(value: Any, name: str, zero: bool = False) -> float:
    """A Python API timeout in seconds: a number > 0 (>= 0 with ``zero``)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    number = float(value) if ok else -1.0
    if not math.isfinite(number) or number < 0 or (number == 0 and not zero):
        bound = ">= 0" if zero else "> 0"
        raise OptionError(f"{FAMILY}: argument {name!r} must be a number of seconds {bound}, "
                          f"got {value!r}", option=name)
    return number
