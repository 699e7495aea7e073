"""The exactly-once ``eo_kafka`` sink: ``sink`` (KafkaSink, the protocol), ``options``
(KafkaSinkOptions), the delivery modes, one task attempt each (``writer``, their base;
``recovery_key_mode``; ``transactional_mode``), ``producers``, ``rows``, ``partitioner``,
``recovery``, ``commit_facts``, ``batch_produce`` and ``targets``.
It imports nothing of the source: what the two share is :mod:`connectors.kafka.common`.

``connectors.kafka.sink.KafkaSink`` is the public name, as before the sink became a package.
"""

from connectors.kafka.sink.sink import (
    PRODUCER_DEFAULTS,
    KafkaSink,
    TaskReport,
    check_columns,
    check_producer_config,
    deterministic_order,
)

__all__ = ["PRODUCER_DEFAULTS", "KafkaSink", "TaskReport", "check_columns",
           "check_producer_config", "deterministic_order"]
