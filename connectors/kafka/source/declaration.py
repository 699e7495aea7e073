"""The ``eo_kafka`` source's options, declared once: Spark's option name, the key of its value
(the field of :class:`~connectors.kafka.source.options.KafkaSourceOptions` it sets, where
one does; the source has no Python constructor), the kind, default, bounds and help.

From these declarations (and the Schema Registry's, in ``format_options.py``):

- ``KafkaSourceOptions.parse`` reads every option (:data:`READ_OPTIONS`) through its kind,
  with :func:`~connectors.core.declared.spark_values`, as the sinks do; an option that is
  not declared is refused, naming the closest declared one;
- docs/kafka-source.md's options table is generated from :data:`KAFKA_SOURCE_OPTIONS`
  (``tests/unit/test_source_options_doc.py`` checks it; ``UPDATE_DOCS=1`` rewrites it).

The options whose value has a structure (the subscription, the starting and ending offsets,
``clusters``) have kinds of their own (:mod:`connectors.kafka.source.kinds`); what ties
several options together (exactly one subscription, a start or a ``clusters`` entry) is
checked by ``options.py`` on the values read.
"""

from __future__ import annotations

from connectors.core.declared import (
    BOOLEAN,
    CHOICE,
    INTEGER,
    PREFIXED,
    STORAGE,
    STRING,
    Opt,
)
from connectors.core.option_kinds import DURATION
from connectors.core.options import IGNORE_UNKNOWN
from connectors.kafka.common import CONNECT_TIMEOUT, METADATA_RETRY_TIMEOUT
from connectors.kafka.source import kinds
from connectors.kafka.source.format_options import FORMAT_OPTIONS
from connectors.kafka.source.offsets import DEFAULT_TARGET_RECORDS

DEFAULT_GROUP_PREFIX = "eo-kafka-source"

# Required unless `clusters` names the brokers: options.py says so (required=False here).
BOOTSTRAP = Opt("kafka.bootstrap.servers", "bootstrap", STRING, shown_default="required",
                hint="e.g. 'host1:9092,host2:9092'", help="broker list (not with `clusters`)")
SUBSCRIBE = Opt("subscribe", "subscribe", kinds.TOPICS, shown_default="exactly one of the three",
                help="topic list `a,b`")
SUBSCRIBE_PATTERN = Opt("subscribePattern", "subscribe_pattern", kinds.PATTERN,
                        help="a regular expression of topic names")
ASSIGN = Opt("assign", "assign", kinds.PARTITIONS,
             help='JSON `{"a": [0, 1]}`: these partitions only')
STARTING_OFFSETS = Opt(
    "startingOffsets", "starting_offsets", kinds.START,
    shown_default="streaming `latest`, batch `earliest`",
    help="`earliest`, `latest`, `group` (the consumer group's committed offsets, earliest "
    'where it has none), or JSON `{"t": {"0": 23, "1": -2}}` (-2 = earliest, -1 = latest; it '
    "must name every partition). Only used by a new query; a restarted query continues from "
    "its checkpoint")
STARTING_BY_TIMESTAMP = Opt(
    "startingOffsetsByTimestamp", "starting_offsets_by_timestamp", kinds.START_BY_TIMESTAMP,
    help='JSON `{"t": {"0": <epoch ms>}}`: the first offset at or after that time')
STARTING_TIMESTAMP = Opt("startingTimestamp", "starting_timestamp", kinds.START_TIMESTAMP,
                         help="one epoch-ms timestamp for every partition")
TIMESTAMP_STRATEGY = Opt(
    "startingOffsetsByTimestampStrategy", "timestamp_strategy", CHOICE, "error",
    choices=("error", "latest"),
    help="`latest`: a partition with no record after the timestamp starts at its end instead "
    "of failing")
ENDING_OFFSETS = Opt("endingOffsets", "ending", kinds.END, shown_default="`latest`",
                     help="batch only: `latest` or JSON (-1 = latest; -2 is refused)")
MAX_OFFSETS = Opt(
    "maxOffsetsPerTrigger", "max_offsets_per_trigger", INTEGER, minimum=1,
    shown_default="none",
    help="at most this many offsets per micro-batch. The budget is split across partitions "
    "in proportion to their backlog, and every partition with a backlog gets at least one "
    "offset")
MIN_OFFSETS = Opt("minOffsetsPerTrigger", "min_offsets_per_trigger", INTEGER, minimum=1,
                  shown_default="none",
                  help="wait for at least this many new offsets before the next batch …")
MAX_TRIGGER_DELAY = Opt("maxTriggerDelay", "max_trigger_delay", DURATION, 900.0, minimum=0,
                        shown_default="`15m`", help="… but no longer than this")
MAX_BYTES = Opt(
    "maxBytesPerTrigger", "max_bytes_per_trigger", INTEGER, minimum=1, shown_default="none",
    help="bandwidth control. It is converted to records through the average record size (key "
    "+ value + headers), which is sampled from the backlog and sampled again every 10 batches")
MIN_PARTITIONS = Opt(
    "minPartitions", "min_partitions", INTEGER, minimum=1, shown_default="none",
    help="split Kafka partition ranges so that a batch has at least this many Spark "
    "partitions, in proportion to size. The split is deterministic: the same offsets always "
    "give the same splits")
MAX_RECORDS_PER_PARTITION = Opt("maxRecordsPerPartition", "max_records_per_partition", INTEGER,
                                minimum=1, shown_default="none",
                                help="no Spark partition reads more than this many offsets")
TARGET_RECORDS = Opt(
    "targetRecordsPerPartition", "target_records_per_partition", INTEGER,
    DEFAULT_TARGET_RECORDS, minimum=0,
    help="Kafka partition ranges smaller than this are grouped into Spark partitions of up to "
    "this many records, each read by one consumer (\"Many partitions\" below); larger ranges "
    "are a Spark partition each (split further by `minPartitions`/`maxRecordsPerPartition`). "
    "`0` turns grouping off: one Spark partition per range, as Spark's own source plans. Not "
    "in Spark's source")
FAIL_ON_DATA_LOSS = Opt(
    "failOnDataLoss", "fail_on_data_loss", BOOLEAN, True,
    help="offsets that can no longer be read fail the query. `false` logs a warning and skips "
    "them. Such offsets come from retention, a deleted or recreated topic, a deleted "
    "partition, or a start offset beyond the log. An end below the start is asked again of "
    "freshly looked-up leaders 3 times, 1 s apart, before it is believed (a node back from a "
    "partition or a restart can answer from the log it no longer leads), as Spark's "
    "`fetchOffset.numRetries` does")
INCLUDE_HEADERS = Opt("includeHeaders", "include_headers", BOOLEAN, False,
                      help="adds the `headers` column")
KAFKA = Opt("kafka.", "kafka", PREFIXED, arg_note="(keys without `kafka.`)",
            help="passed to librdkafka, for example `kafka.security.protocol`, `kafka.sasl.*` "
            "or `kafka.isolation.level` (default `read_committed`). Secrets are never logged. "
            "Three are refused (below)")
#: One of the kafka.* settings (read with them), named in the table for what it means.
GROUP_ID = Opt("kafka.group.id", "group_id", STRING,
               help="the consumer group that committed offsets go to (and that "
               "`startingOffsets=group` reads)")
# No declared default: set together with kafka.group.id, it is an error (options.py).
GROUP_ID_PREFIX = Opt(
    "groupIdPrefix", "group_id_prefix", STRING, shown_default=f"`{DEFAULT_GROUP_PREFIX}`",
    help="without `kafka.group.id`, the group is `<prefix>-<hash>`, where the hash comes from "
    "`walPath` if set, else from the brokers and the subscription. It is stable across "
    "restarts")
WAL_PATH = Opt(
    "walPath", "wal_path", STRING, shown_default="none",
    help="directory of the window WAL (`<walPath>/source`): a local path, `hdfs://`, "
    "`webhdfs://`, or an object store (`s3://`, `gs://`, `abfss://`, reached with the "
    "`storage.*` options and the provider's environment), whose conditional writes are "
    "probed before the first window is recorded. Without it there is no WAL")
STORAGE_OPTIONS = Opt(
    "storage.", "storage", STORAGE, arg_note="(keys without `storage.`)",
    help="how to reach an object store holding `walPath` (endpoint, region, credentials; "
    "docs/deploying.md, \"Credentials and endpoints\"); an error without `walPath`")
CLUSTERS = Opt(
    "clusters", "cluster_entries", kinds.JSON_LIST,
    help='JSON list `[{"name": "east", "bootstrap": "h1:9092", "subscribe": "t"}, '
    '{"bootstrap": "h2:9092", "assign": {"t": [0]}, "startingOffsets": "earliest", '
    '"kafka.security.protocol": "SSL"}]`. Each entry has exactly one of `subscribe`, '
    "`subscribePattern` or `assign`. Top-level `kafka.*` and `startingOffsets` apply to every "
    "entry unless the entry overrides them")
POLL_TIMEOUT = Opt("kafkaConsumer.pollTimeoutMs", "poll_timeout", INTEGER, 120_000, minimum=1,
                   help="milliseconds (Spark's name and unit): a read that makes no progress "
                   "for this long fails the task")
ARROW_BATCH = Opt("arrowBatchRecords", "arrow_batch_records", INTEGER, 20000, minimum=1,
                  help="records per Arrow batch handed to Spark")
IGNORE_UNKNOWN_OPTIONS = Opt(IGNORE_UNKNOWN, "ignore_unknown_options", BOOLEAN, False,
                             help="`true`: an unknown option is only warned about")

#: ``KafkaWindows`` pins a batch read to one window of its WAL with this; not for users.
WINDOW = Opt("eo.window", "window", INTEGER, minimum=0)

#: Every option of the source in the docs table's order (the Schema Registry's are in
#: ``format_options.FORMAT_OPTIONS``, with a table of their own; ``eo.window`` is internal).
KAFKA_SOURCE_OPTIONS: tuple[Opt, ...] = (
    BOOTSTRAP, SUBSCRIBE, SUBSCRIBE_PATTERN, ASSIGN, STARTING_OFFSETS, STARTING_BY_TIMESTAMP,
    STARTING_TIMESTAMP, TIMESTAMP_STRATEGY, ENDING_OFFSETS, MAX_OFFSETS, MIN_OFFSETS,
    MAX_TRIGGER_DELAY, MAX_BYTES, MIN_PARTITIONS, MAX_RECORDS_PER_PARTITION, TARGET_RECORDS,
    FAIL_ON_DATA_LOSS, INCLUDE_HEADERS, KAFKA, GROUP_ID, GROUP_ID_PREFIX, WAL_PATH,
    STORAGE_OPTIONS, CLUSTERS, CONNECT_TIMEOUT, METADATA_RETRY_TIMEOUT, POLL_TIMEOUT,
    ARROW_BATCH, IGNORE_UNKNOWN_OPTIONS,
)

#: Every option the source reads, in the order it reads them: the table's (``kafka.group.id``
#: is one of ``kafka.*``), the Schema Registry's and ``eo.window``.
READ_OPTIONS: tuple[Opt, ...] = (
    *(o for o in KAFKA_SOURCE_OPTIONS if o is not GROUP_ID), *FORMAT_OPTIONS, WINDOW)
