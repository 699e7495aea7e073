"""Everything that knows Spark lives in this package (DESIGN.md sections 3 and 9).

- ``datasources``: the registered Python DataSources (``eo_kafka``, ``eo_jdbc``,
  ``eo_files``);
- ``sink_adapter``: the one adapter from the sink protocol to Spark's writers and to
  ``foreachBatch``;
- ``kafka_source``: the ``eo_kafka`` stream and batch readers.
"""

from connectors.spark.datasources import DATA_SOURCES, register

__all__ = ["DATA_SOURCES", "register"]
