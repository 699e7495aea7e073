"""A Kafka sink whose ``key``/``value`` columns are encoded with a Schema Registry format
before the sink sees them (docs/schema-registry.md, "Writing").

:class:`EncodingSink` wraps the ``eo_kafka`` sink and keeps its delivery guarantee and its
unit of parallelism (one writer partition per task): staging is the wrapped sink's, after
each Arrow batch's formatted columns become framed bytes; commit, abort and the batch-order
rules are the wrapped sink's. The writer schemas and ids are resolved on the driver
(:func:`~connectors.kafka.registry.sink_formats.resolve`) before any task runs and travel
with the sink, so a retried batch writes the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa

from connectors.core.sink import BatchSink, TaskInfo
from connectors.kafka.registry import sink_formats
from connectors.kafka.registry.sink_formats import SinkFormats


class EncodingSink(BatchSink):
    """``inner`` with ``formats`` applied to its input (see the module)."""

    def __init__(self, inner: BatchSink, formats: SinkFormats) -> None:
        self.inner = inner
        self.formats = formats
        self.family = inner.family  # messages and failpoint names are the sink's own
        self.options = inner.options  # sink_id, topic, ... read through BatchSink.__getattr__

    # -- driver --------------------------------------------------------------------------
    def check_schema(self, schema: pa.Schema) -> None:
        if not all(c.schema is not None for c in self.formats.columns):
            self.formats = sink_formats.resolve(self.formats, schema,
                                                getattr(self.inner.options, "topic", None))
        self.inner.check_schema(sink_formats.encoded_schema(schema, self.formats))

    def check_service(self) -> None:
        self.inner.check_service()

    def commit(self, batch_id: int, messages: Sequence[Any]) -> None:
        self.inner.commit(batch_id, messages)

    def abort(self, batch_id: int, messages: Sequence[Any | None]) -> None:
        self.inner.abort(batch_id, messages)

    def last_committed(self) -> int | None:
        return self.inner.last_committed()

    def admit(self, batch_id: int) -> bool:
        return self.inner.admit(batch_id)

    def batch_offset(self) -> int:
        return self.inner.batch_offset()

    @property
    def zombie_risk(self) -> str | None:
        return self.inner.zombie_risk

    def close(self) -> None:
        self.inner.close()

    # A foreachBatch write never hands rows to the driver's commit: they would skip encoding.
    @property
    def inline_budget(self) -> int:
        return 0

    # -- executor ------------------------------------------------------------------------
    def stage(self, task: TaskInfo, batches: Iterator[pa.RecordBatch]) -> Any:
        encoders = {c.column: sink_formats.AvroEncoder(c) for c in self.formats.columns}
        return self.inner.stage(
            task, (sink_formats.encode_batch(b, encoders) for b in batches))

    def __repr__(self) -> str:
        return repr(self.inner)
