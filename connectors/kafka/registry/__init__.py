"""Schema Registry formats of the Kafka source and sink (docs/schema-registry.md): the
Confluent wire format (magic byte 0, a 4-byte big-endian schema id, the payload), the
registry client, and the Avro codec between payloads and Arrow columns. No Spark import."""
