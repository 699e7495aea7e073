"""Kafka's wire protocol, spoken by this package itself: the project's own Kafka client.

- :mod:`~connectors.kafka.wire.protocol`: API keys, error codes, primitive encodings, one
  broker connection; :mod:`~connectors.kafka.wire.requests`: every request and answer, each
  version side by side; :mod:`~connectors.kafka.wire.sasl`, :mod:`~connectors.kafka.wire.
  settings`: logins and what is taken from a librdkafka configuration;
- :mod:`~connectors.kafka.wire.cluster`: one cluster as a process reaches it (brokers,
  connections shared by every caller, kept leaders, coordinators, retries);
  :mod:`~connectors.kafka.wire.admin`: the look-ups (ListOffsets to every leader at once,
  topics, groups, CreateTopics, DescribeConfigs);
- :mod:`~connectors.kafka.wire.producer` (the producer's state machine and its requests),
  :mod:`~connectors.kafka.wire.partition` (its state of each partition),
  :mod:`~connectors.kafka.wire.sender` (Produce requests), :mod:`~connectors.kafka.wire.
  record_batch` and its C part (record batches from Arrow buffers).

Used where librdkafka cannot serve: the Kafka sink's record batches
(:mod:`connectors.kafka.sink.wire_transport`), and the look-ups both connectors make in a
query's processes: librdkafka's admin requests that wait for the controller or a coordinator
can abort the process (docs/design.md, "Kafka nodes that move or go away"). Which one a part
uses is decided in :mod:`connectors.kafka.clients`. This package imports neither connector,
and no module of it holds state: a :class:`~connectors.kafka.wire.cluster.Cluster` or a
producer belongs to whoever made it.
"""
