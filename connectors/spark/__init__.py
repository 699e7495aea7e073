"""Everything that knows Spark lives in this package (docs/architecture.md; the
sink adapter: docs/design.md, "One sink protocol, two adapters").

- ``datasources``: the registered Python DataSources (``eo_kafka``, ``eo_jdbc``,
  ``eo_files``);
- ``sink_adapter``: the one adapter from the sink protocol to Spark's writers and to
  ``foreachBatch`` (``connectors/__init__.py`` installs it behind every sink's ``write``),
  with the duplicate-writer check, the inline-path budget and the speculation warning;
- ``kafka_source``: the ``eo_kafka`` stream and batch readers, where Spark's offset JSON is
  decoded and encoded.
- ``checkpoint``: a checkpoint whose driver died while Spark wrote its first batch, which
  Spark 4.1+ refuses to start on, and the one safe repair.
"""

from connectors.spark.datasources import DATA_SOURCES, register

__all__ = ["DATA_SOURCES", "register"]
