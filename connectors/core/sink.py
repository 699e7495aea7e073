"""The one sink protocol that the JDBC, Kafka and file sinks implement (docs/design.md,
"One sink protocol, two adapters").

All three sinks have the same shape: executor tasks *stage* their rows, then the driver
*commits the batch once*. A sink class therefore contains only its own storage logic;
``connectors.spark`` adapts this protocol to Spark once, as a DataSource writer and as a
``foreachBatch`` callable, and owns the batch-id plumbing. This module never imports Spark:
``BatchSink.write`` hands the DataFrame to the writer that ``connectors/__init__.py``
installs (:func:`set_dataframe_writer`), the Spark adapter.

The contract every sink keeps (named, not numbered: the sinks' own steps are numbered):

- **stage** ``(task, batches)`` runs on an executor for one writer partition of one batch.
  It may run several times for the same ``(batch_id, writer_id)`` (task retries,
  speculative attempts, whole-batch replays after a crash). It returns a small picklable
  message.
- **commit** ``(batch_id, messages)`` runs on the driver with the messages of the winning
  attempts, one per writer partition. It makes the batch visible atomically and records
  it as committed *in the same step*. For a batch already committed it changes nothing.
- **abort** ``(batch_id, messages)`` removes what the batch staged. It must tolerate
  ``None`` messages (tasks that failed before reporting). Spark also calls it when
  ``commit`` raised, so it must never undo or break a commit that may have partly
  happened (a file sink keeps the files that a pending plan still needs).
- **last_committed** ``()`` returns the highest committed batch id (or None).
- **admit** ``(batch_id)`` decides, before anything is written, on executors and on the
  driver: first *ownership* (the state at this walPath/path belongs to this ``sink_id``,
  else :class:`SinkOwnershipError`), then the *batch order*: a batch id above the last
  committed one is written, the last committed one again is a replay and writes nothing,
  and one below it is refused (:class:`BatchOrderError`): Spark replays only its last
  batch, so a lower id means a new checkpoint or a second writer, and skipping it would
  lose its rows. ``eo-connectors sink reset`` records a restart in the sink's state; the
  sink then maps the new query's batch ids above the old ones (``batch_offset``).

Exactly-once holds when the ``batch_id`` handed to a batch is stable on replay (Spark's
``batchId`` or a ``KafkaWindows`` window id) and the sink's identity (``sink_id``/path) is
stable across restarts.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from connectors.core.errors import BatchOrderError, ConnectorError, SinkOwnershipError

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

#: ``(sink, df, batch_id) -> None``: runs the protocol for a DataFrame (stage per partition,
#: commit on the driver). ``connectors/__init__.py`` installs the Spark adapter's.
DataFrameWriter = Callable[["BatchSink", Any, int], None]
_dataframe_writer: DataFrameWriter | None = None


S = TypeVar("S", bound="BatchSink")


def set_dataframe_writer(writer: DataFrameWriter) -> None:
    """Install what ``BatchSink.write`` runs (the root package installs the Spark adapter)."""
    global _dataframe_writer
    _dataframe_writer = writer


def check_batch_order(family: str, sink_id: str | None, batch_id: int, last: int | None,
                      where: str, reset: str, offset: int = 0) -> bool:
    """The batch-order rule of every sink: True to write ``batch_id``, False for a replay of
    the last committed batch; :class:`BatchOrderError` for a batch id below it.

    ``batch_id`` and ``last`` are the sink's own numbering (Spark's id + ``offset``, the
    batch offset a reset recorded); messages show the query's numbering. ``reset`` is the
    command that records a restart for this sink.
    """
    if last is None or batch_id > last:
        return True
    if batch_id == last:
        return False
    raise BatchOrderError(
        f"{family}: sink_id {sink_id!r} at {where}: batch {batch_id - offset} is below the "
        f"sink's last committed batch {last - offset}. Spark replays only its last batch, "
        "so this is a new checkpoint (batch ids restarted at 0) or a second query writing "
        "with the same sink_id; its rows would be skipped as already written, so nothing was "
        "written. To start over, give the query a new sink_id, or record the restart with "
        f"`{reset}` (batch ids from 0 are then accepted)"
    )


def ownership_error(family: str, what: str, where: str, owner: str | None,
                    sink_id: str | None) -> SinkOwnershipError:
    """Two sinks sharing one state: the second would skip the first one's batch ids."""
    return SinkOwnershipError(
        f"{family}: {what} {where} belongs to sink_id {owner!r}, not {sink_id!r}; its "
        "committed batches would be taken for this sink's and skipped, so nothing was "
        f"written. Give each sink its own {what}, or use sink_id {owner!r} if this is the "
        "same pipeline"
    )


@dataclass(frozen=True)
class TaskInfo:
    """Identity of one staging task.

    ``batch_id`` and ``writer_id`` (Spark's partition id) are deterministic across retries.
    ``attempt`` is Spark's attempt number: use it only to tell attempts apart, never as an
    identity that must survive a retry.
    """

    batch_id: int
    writer_id: int
    attempt: int = 0


class BatchSink(ABC):
    """Base class of every sink: stage on executors, commit once on the driver.

    Subclasses are picklable *specs*: they hold parsed options only and open connections
    lazily inside ``stage``/``commit`` (drop them in ``__getstate__``).
    """

    #: the short format name, used in messages and failpoint names (``jdbc``, ``files``...)
    family: str = "sink"

    @abstractmethod
    def stage(self, task: TaskInfo, batches: Iterator[pa.RecordBatch]) -> Any:
        """Write this task's rows where the driver's commit can find them; return a message."""

    @abstractmethod
    def commit(self, batch_id: int, messages: Sequence[Any]) -> None:
        """Make the batch visible exactly once; a no-op for an already committed batch."""

    @abstractmethod
    def abort(self, batch_id: int, messages: Sequence[Any | None]) -> None:
        """Remove what this batch staged. Must not touch committed output."""

    @abstractmethod
    def last_committed(self) -> int | None:
        """The highest committed batch id, or None if nothing was committed yet."""

    @classmethod
    def from_parsed(cls: type[S], options: Any) -> S:
        """A sink from its already parsed options (``from_options`` parses Spark's)."""
        sink = cls.__new__(cls)
        sink._init(options)
        return sink

    def _init(self, options: Any) -> None:
        """Set up from parsed options: ``__init__`` and ``from_parsed`` both end here."""
        self.options = options

    def __getattr__(self, name: str) -> Any:
        # A sink's parsed options (``self.options``, a frozen dataclass) read as its own
        # attributes: ``sink.sink_id``, ``sink.topic``, ``sink.max_records_per_file``...
        options = self.__dict__.get("options")
        if options is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(options, name)

    @property
    def zombie_risk(self) -> str | None:
        """Why an attempt Spark gave up on (a zombie: a speculative twin, a hung task) that
        still writes after its retry started would break the guarantee, with the remedy;
        None when it cannot. The adapter logs it when Spark speculation is on."""
        return None

    def is_committed(self, batch_id: int) -> bool:
        last = self.last_committed()
        return last is not None and last >= batch_id

    def admit(self, batch_id: int) -> bool:
        """Ownership, then the batch-order rule (the contract's *admit*): True to write
        ``batch_id``, False when it is a replay of the last committed batch. Raises
        :class:`SinkOwnershipError` or :class:`BatchOrderError`. Sinks with durable state
        of their own override it to check ownership first."""
        return check_batch_order(self.family, getattr(self, "sink_id", None), batch_id,
                                 self.last_committed(), repr(self), "eo-connectors sink reset")

    def batch_offset(self) -> int:
        """What ``eo-connectors sink reset`` recorded: the sink's batch ids are the query's
        plus this (0 when never reset). The Spark adapter adds it on the driver, before any
        task runs, so both planes use the sink's numbering."""
        return 0

    def check_schema(self, schema: pa.Schema) -> None:  # noqa: B027 - optional hook
        """Driver-side validation before any task runs; raise to fail the batch early."""

    def check_service(self) -> None:  # noqa: B027 - optional hook
        """Driver-side, after ``check_schema``: the external system answers (within a
        bounded time) before any task runs; raise one clear error if it does not."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release driver-side resources (connections)."""

    # -- the driver's share of a foreachBatch write (optional) ---------------------------------
    @property
    def inline_budget(self) -> int:
        """Rows a ``foreachBatch`` write may hand to the driver whole, over all partitions, to
        be written by the commit itself (0: never). The adapter splits it by partitions."""
        return 0

    def with_inline_limit(self, rows_per_partition: int) -> BatchSink:
        """A copy of this sink whose tasks send partitions of at most ``rows_per_partition``
        rows to the driver instead of staging them (see ``inline_budget``)."""
        return self

    # -- Python API: foreachBatch callable and batch writes ---------------------------------
    def write(self, df: Any, batch_id: int) -> None:
        """Write a DataFrame as batch ``batch_id``, exactly once per ``batch_id``."""
        if _dataframe_writer is None:
            raise ConnectorError(
                f"{self.family}: no DataFrame writer is installed; import the package "
                "'connectors' (it installs the Spark adapter) before writing a DataFrame"
            )
        _dataframe_writer(self, df, batch_id)

    def __call__(self, df: Any, batch_id: int) -> None:
        """``writeStream.foreachBatch(sink)``: Spark passes ``(df, batchId)``."""
        self.write(df, batch_id)
