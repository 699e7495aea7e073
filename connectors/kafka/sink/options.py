"""Options of the ``eo_kafka`` sink, declared once (:data:`KAFKA_SINK_OPTIONS`): Spark's
string options and the Python API's arguments both become a frozen, picklable
:class:`KafkaSinkOptions` through it (docs/kafka-sink.md shows the table it generates)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar

from connectors.core.declared import (
    BOOLEAN,
    CHOICE,
    DURATION,
    INTEGER,
    PREFIXED,
    STORAGE,
    STRING,
    Declared,
    Opt,
    Values,
    sink_id_option,
)
from connectors.core.options import RedactedDict
from connectors.core.storage import StorageOptions, check_state_path
from connectors.kafka.common import (
    CONNECT_TIMEOUT,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_RETRY_TIMEOUT,
    FAMILY,
    METADATA_RETRY_TIMEOUT,
)
from connectors.kafka.config import check_client_config
from connectors.kafka.sink import recovery
from connectors.kafka.sink.commit_facts import DEFAULT_FACTS_TOPIC, EXPIRED_FACT_POLICIES
from connectors.kafka.sink.partitioner import NULL_KEY_RUN_BYTES
from connectors.kafka.sink.producers import producer_config

_SERVERS_HINT = "the brokers' host:port list"
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")

#: The sink's options, declared once: ``KafkaSink(...)``'s arguments, the DataSource's options,
#: the unknown-option check and the table in docs/kafka-sink.md all come from here.
KAFKA_SINK_OPTIONS: tuple[Opt, ...] = (
    Opt("kafka.bootstrap.servers", "bootstrap_servers", STRING, shown_default="required",
        hint=_SERVERS_HINT, help="the brokers' `host:port` list (in Python it may also be "
        "`bootstrap.servers` in `kafka_options`)"),
    Opt("kafka.", "kafka_options", PREFIXED, arg_note="(keys without `kafka.`)",
        help="passed to librdkafka's producer, and, apart from producer-only keys, to the "
        "recovery scan's consumer (security settings and so on)"),
    Opt("topic", "topic", STRING,
        help="the target topic, unless each row has a `topic` column"),
    sink_id_option(
        True, "a stable name for this sink, unique per output: 1-128 characters from "
        "`A-Z a-z 0-9 . _ -`, not starting with `.`, no `..`. It goes into every recovery key "
        "and into `transactional.id`. Never reuse it for another output.",
        hint="a stable name for this sink, unique per output"),
    Opt("walPath", "wal_path", STRING, required=True,
        hint="a directory for the sink's commit log and markers",
        help="a directory for the sink's commit log and started markers: a local path, "
        "`hdfs://`, `webhdfs://`, or an object store (`s3://`, `gs://`, `abfss://`). It must "
        "stay the same across restarts, and there is one per sink (the sink refuses a "
        "`walPath` that another `sink_id` owns)."),
    Opt("storage.", "storage_options", STORAGE, shown_default="provider chain",
        help="object stores only: endpoint, region, credentials, timeouts of the store "
        "holding `walPath` ([deploying.md](deploying.md#credentials-and-endpoints))"),
    Opt("deterministicOrder", "deterministic_order", BOOLEAN, False,
        help="`true` skips the per-task sort. Set it only when the rows of each input "
        "partition arrive in the same order on every replay, for example an `eo_kafka` "
        "source with no shuffle."),
    Opt("transactional", "transactional", BOOLEAN, False,
        help="per-task Kafka transactions with a commit fact, see "
        "[below](#transactionaltrue)"),
    Opt("batchProduce", "batch_produce", BOOLEAN, True,
        help="without a `headers` column: hand the records to librdkafka from Arrow buffers "
        "instead of one `produce()` call per record: with `transactional=true` an Arrow batch "
        "per `rd_kafka_produce_batch` call, with recovery keys a C loop over "
        "`rd_kafka_produceva` that adds each record's header (see [Cost](#cost)). `false` "
        "produces record by record. The sink falls back to that by itself where the fast "
        "path is not available (not CPython, a confluent-kafka build whose client it cannot "
        "confirm, or, for recovery keys, the `_keyed_produce` extension not built)"),
    Opt("wireProduce", "wire_produce", BOOLEAN, True,
        help="without a `headers` column (and, with `transactional=true`, with a `topic` "
        "option): the sink writes Kafka record batches from the Arrow buffers itself, the "
        "recovery key included, and sends them with Kafka's own requests: the same "
        "idempotent or transactional protocol (InitProducerId, AddPartitionsToTxn, EndTxn), "
        "about half the CPU per record of librdkafka's path (see [Cost](#cost)), through the "
        "same broker failures as librdkafka ([Produce paths](#produce-paths)). It speaks "
        "PLAINTEXT, SSL with PEM files, and "
        "SASL PLAIN or SCRAM, and writes uncompressed batches; with GSSAPI or OAUTHBEARER, "
        "`kafka.compression.type`, a setting it does not honour, or the `_record_batch` "
        "extension not built, the sink hands the records to librdkafka (and logs why once), "
        "as `false` does"),
    Opt("recoveryKeyHeaders", "recovery_key_headers", BOOLEAN, False,
        help="with `transactional=true`: also put the `eo-rk` header on every record, for "
        "consumers that want to trace or dedupe records themselves (costs the header's CPU, "
        "see [Cost](#cost))"),
    Opt("factsTopic", "facts_topic", STRING, DEFAULT_FACTS_TOPIC,
        help="with `transactional=true`: the one-partition topic whose offset 0 holds each "
        "writer's commit fact in its metadata (it stays empty, so the sink's groups show no "
        "lag). The sink creates it when missing; one topic serves every sink of a cluster "
        "([below](#commit-facts-and-offsets-retention))"),
    Opt("expiredFactPolicy", "expired_fact_policy", CHOICE, "fail",
        choices=EXPIRED_FACT_POLICIES,
        help="with `transactional=true`: what a retry does when an earlier attempt of its "
        "task began longer ago than the broker's `offsets.retention.minutes` and its commit "
        "fact is gone, so whether it committed cannot be told: `fail` (refuse, nothing "
        "written), `rewrite` (write the task again; it may then be in the topic twice) or "
        "`skip` (treat it as committed). Set `rewrite` or `skip` for one restart, after "
        "checking the topic ([below](#commit-facts-and-offsets-retention))"),
    Opt("nullKeyRunBytes", "null_key_run_bytes", INTEGER, NULL_KEY_RUN_BYTES, minimum=1,
        help="rows with a null key and no `partition` go to one partition in runs of about "
        "this many bytes (their values and headers), each run to the next partition from a "
        "start set by the task's batch and writer; the default is ten full record batches. "
        "Smaller spreads a batch over more partitions, at the brokers' cost per partition a "
        "write touches. A retry routes by its first attempt's value "
        "([Routing of null keys](#routing-of-null-keys))"),
    METADATA_RETRY_TIMEOUT,
    CONNECT_TIMEOUT,
    Opt("failOnUnknownTopic", "fail_on_unknown_topic", BOOLEAN, False,
        help="a target topic (the `topic` option, checked on the driver, or a `topic` "
        "column, checked by each task) that does not exist: `false` logs one warning naming "
        "it and lets the broker create it with its defaults, as Spark's own sink does (when "
        "the broker has `auto.create.topics.enable=true`); `true` fails with an error naming "
        "the topic, and nothing is created or written"),
    Opt("unsafe", "unsafe", BOOLEAN, False,
        help="accept producer settings that break the guarantee (with a warning)"),
    Opt("flushTimeout", "flush_timeout", DURATION, 300.0, above=0,
        help="the longest a task waits for delivery and for its transaction commit"),
    Opt("scanTimeout", "scan_timeout", DURATION, 120.0, above=0,
        help="the longest a retry's recovery scan may take"),
)


@dataclass(frozen=True)
class KafkaSinkOptions(Declared):
    """The parsed options of one ``eo_kafka`` sink."""

    OPTIONS: ClassVar[tuple[Opt, ...]] = KAFKA_SINK_OPTIONS
    FAMILY: ClassVar[str] = FAMILY

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
    wire_produce: bool = True
    facts_topic: str = DEFAULT_FACTS_TOPIC
    expired_fact_policy: str = "fail"
    null_key_run_bytes: int = NULL_KEY_RUN_BYTES
    #: ``storage.*``: how to reach an object store holding ``walPath``
    storage: StorageOptions = field(default_factory=StorageOptions)

    @classmethod
    def _build(cls, v: Values) -> KafkaSinkOptions:
        """The checks across options, for ``KafkaSink(...)`` and the DataSource alike."""
        kafka_options = v["kafka_options"] or {}
        if not v["bootstrap_servers"] and not any(
                str(k).lower().removeprefix("kafka.") == "bootstrap.servers"
                for k in kafka_options):
            raise v.error("bootstrap_servers", "is required but was not set",
                          f"set it ({_SERVERS_HINT})")
        if not _TOPIC_NAME.fullmatch(v["facts_topic"]):
            raise v.error("facts_topic", f"is not a valid Kafka topic name: {v['facts_topic']!r}",
                          "1-249 characters from A-Z a-z 0-9 . _ -")
        check_state_path(v["wal_path"], v["storage_options"], FAMILY, v.name("wal_path"))
        recovery.key_prefix(v["sink_id"], 0, 0)  # validates the sink id's length
        conf = producer_config(kafka_options, v["bootstrap_servers"], v["unsafe"])
        # The producer's whole configuration, checked by librdkafka now (on the driver, at
        # the constructor or save()/start()), not in a task (connectors.kafka.config).
        spark = v.name("kafka_options") == "kafka."
        check_client_config(FAMILY, conf, "producer",
                            option=(lambda k: f"kafka.{k}") if spark
                            else (lambda k: f'kafka_options["{k}"]'),
                            also_for="consumer")
        return v.build(
            cls, used=("bootstrap_servers", "kafka_options", "storage_options"),
            producer_conf=conf, storage=v["storage_options"])
