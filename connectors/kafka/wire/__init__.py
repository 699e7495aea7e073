"""Kafka's wire protocol, spoken by this package itself: the requests, one broker
connection, SASL, the settings taken from a librdkafka configuration, and a cluster client
(brokers found from any live one, a connection per node, coordinator look-ups, retries with
librdkafka's backoff).

Used where librdkafka cannot serve: the Kafka sink's record batches
(:mod:`connectors.kafka.sink.wire`), and the look-ups both connectors make in a query's
processes (:mod:`connectors.kafka.wire.admin`): librdkafka's admin requests that wait for
the controller or a coordinator can abort the process (docs/design.md, "Kafka nodes that move
or go away"). The source and the sink both use it; it imports neither.
"""
