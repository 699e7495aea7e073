"""The Kafka family: the source (``source/``), the sink (``sink/``) and the one module the
two share (``common``). Their clients are cached per process (Python workers are reused
across tasks); ``close_cached_clients`` releases them."""

from __future__ import annotations


def close_cached_clients() -> None:
    """Close the Kafka clients this process cached: consumers of the source; producers,
    admin clients and commit-fact clients of the sink. For a long-lived process (a driver,
    a test session) that stops using a cluster: librdkafka clients otherwise keep
    reconnecting to it, and log each failed attempt, until the process exits. The next read
    or write creates new ones."""
    from connectors.kafka.sink.commit_facts import close_cached_fact_writers
    from connectors.kafka.sink.producers import close_cached_producers
    from connectors.kafka.source.range_reader import close_cached_consumers

    close_cached_consumers()
    close_cached_producers()
    close_cached_fact_writers()
