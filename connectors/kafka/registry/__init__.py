"""Schema Registry formats of the Kafka source and sink (docs/schema-registry.md): the
Confluent wire format, the registry client, and one module per format (Avro, JSON Schema,
Protobuf) holding both directions, named in the table of :mod:`.serde`. No Spark import."""
