"""Optional C extensions of the Kafka sink:

- ``_keyed_produce``: the recovery-key mode's produce loop
  (connectors/kafka/sink/_keyed_produce.c);
- ``_record_batch``: Kafka record batches built from Arrow buffers, both modes' wire path,
  and the row hash of the recovery-key mode's order (connectors/kafka/wire/_record_batch.c);
- ``_avro_decode``: the source's columnar decoding of flat Avro records
  (connectors/kafka/registry/_avro_decode.c); without it fastavro decodes every record.

Both are optional: where they cannot be built (no C compiler), the install still succeeds
and the sink hands its records to librdkafka instead, a slower path with the same records
(docs/kafka-sink.md, "Cost")."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "connectors.kafka.sink._keyed_produce",
            ["connectors/kafka/sink/_keyed_produce.c"],
            optional=True,
        ),
        Extension(
            "connectors.kafka.wire._record_batch",
            ["connectors/kafka/wire/_record_batch.c"],
            optional=True,
        ),
        Extension(
            "connectors.kafka.registry._avro_decode",
            ["connectors/kafka/registry/_avro_decode.c"],
            optional=True,
        ),
    ]
)
