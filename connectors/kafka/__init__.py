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
    import connectors.kafka.sink.commit_facts  # noqa: F401 - registers its cache
    import connectors.kafka.sink.producers  # noqa: F401 - registers its caches
    import connectors.kafka.source.range_reader  # noqa: F401 - registers its cache
    from connectors.kafka.common import close_client_caches

    close_client_caches()
