"""A task's rows, readable again: what lets a sink retry a whole staging transaction.

Spark hands a writer task its rows as a one-shot iterator of Arrow batches. A sink that
retries its staging transaction after a transient fault (a lost database connection) must
write the same rows again, from the start, inside the new transaction; Spark's own task
retry would do that too, but a failed task may end the query (local mode allows one
attempt), and it recomputes the partition.

:class:`ReplayableBatches` records each batch as the first pass pulls it from Spark: in
memory up to ``memory_limit`` bytes, then in Arrow IPC files in a temporary directory (the
task's local disk). Every ``iter()`` reads what was recorded, then goes on pulling from
Spark, recording as it goes, so an attempt that failed halfway hands the next one every row
it had seen and the rest still unread. One pass at a time; :meth:`close` (or ``with``)
removes the files.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from types import TracebackType

import pyarrow as pa

#: Batches up to this many bytes stay in memory; later ones go to the spill files.
MEMORY_LIMIT = 64 << 20


class ReplayableBatches(Iterable[pa.RecordBatch]):
    """The batches of ``source``, which every ``iter()`` yields again from the first."""

    def __init__(self, source: Iterable[pa.RecordBatch], memory_limit: int = MEMORY_LIMIT
                 ) -> None:
        self._source = iter(source)
        self._memory_limit = memory_limit
        self._in_memory: list[pa.RecordBatch] = []
        self._memory_bytes = 0
        #: closed spill files, in order, and the one being written
        self._spilled: list[str] = []
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._writer_path = ""
        self._writer_schema: pa.Schema | None = None
        self._dir: str | None = None
        self._exhausted = False

    @property
    def spilled(self) -> bool:
        """True when some batches went to disk (for tests and logs)."""
        return bool(self._spilled) or self._writer is not None

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        self._close_writer()  # a replay reads every spill file whole
        yield from self._in_memory
        for path in list(self._spilled):
            with pa.memory_map(path) as source:
                yield from pa.ipc.open_stream(source)
        while not self._exhausted:
            batch = next(self._source, None)
            if batch is None:
                self._exhausted = True
                break
            self._record(batch)
            yield batch

    def _record(self, batch: pa.RecordBatch) -> None:
        if not self.spilled and self._memory_bytes + batch.nbytes <= self._memory_limit:
            self._in_memory.append(batch)
            self._memory_bytes += batch.nbytes
            return
        if self._writer is not None and self._writer_schema != batch.schema:
            self._close_writer()
        if self._writer is None:
            if self._dir is None:
                self._dir = tempfile.mkdtemp(prefix="eo-replay-")
            self._writer_path = os.path.join(self._dir, f"{len(self._spilled):05d}.arrow")
            self._writer_schema = batch.schema
            self._writer = pa.ipc.new_stream(self._writer_path, batch.schema)
        self._writer.write_batch(batch)

    def _close_writer(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._spilled.append(self._writer_path)
            self._writer = None

    def close(self) -> None:
        """Drop the recorded batches and remove the spill files."""
        self._close_writer()
        self._in_memory.clear()
        self._spilled.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> ReplayableBatches:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
