"""The one exception hierarchy of the package.

Every error a user can see derives from :class:`ConnectorError`, so a pipeline can catch
"anything this connector suite raised" in one clause. Messages name the option or object
(topic/partition/offset, table/column, path), say what was wrong and what would be valid.
"""

from __future__ import annotations

from typing import TypeVar


class ConnectorError(Exception):
    """Root of every error raised by this package."""

    #: The service did not answer within its time (an outage, not a wrong setting): a check
    #: that passed before may let the work go on and leave the outage to its retries.
    unreachable: bool = False


E = TypeVar("E", bound=ConnectorError)


def outage(error: type[E], message: str) -> E:
    """``error(message)`` marked :attr:`ConnectorError.unreachable`."""
    failed = error(message)
    failed.unreachable = True
    return failed


class OptionError(ConnectorError, ValueError):
    """A user option is missing, malformed or out of range.

    ``option`` holds the option's name as the user spelled it in Spark's API, so tools can
    point at it. The message never contains the value of a secret option.
    """

    def __init__(self, message: str, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option


class UnknownArgumentError(OptionError, TypeError):
    """A keyword argument the constructor does not take (a ``TypeError``, as Python raises
    for one, that names the closest valid argument)."""


class StorageError(ConnectorError):
    """A filesystem backend (local or HDFS) failed, or a URL names an unsupported store."""


class WalError(ConnectorError):
    """The write-ahead log is unreadable or was used out of protocol."""


class KafkaSourceError(ConnectorError):
    """The ``eo_kafka`` reader failed: data loss, unreachable broker, bad offsets."""


class KafkaSinkError(ConnectorError):
    """The ``eo_kafka`` writer failed: delivery error, unsafe producer settings, bad input."""


class KafkaClientError(ConnectorError):
    """The project's own Kafka client (``connectors/kafka/wire``) met an error answer or a
    broker it could not reach; the connectors wrap it in their family's error where they
    say what to do."""


class JdbcSinkError(ConnectorError):
    """The ``eo_jdbc`` writer failed: schema mismatch, database error, protocol violation."""


class FileSinkError(ConnectorError):
    """The ``eo_files`` writer failed: bad path, unsupported format, rename failure."""


class FailpointError(ConnectorError):
    """Raised by a failpoint whose action is ``raise`` (tests inject task failures with it)."""


class SinkStateError(ConnectorError):
    """A sink's durable state (its WAL, output path or commit row) refuses this write:
    it belongs to another sink, or the batch id went backwards."""


class SinkOwnershipError(SinkStateError):
    """The state at a walPath/output path belongs to another ``sink_id``: writing would
    take that sink's committed batches for this one's and skip them."""


class BatchOrderError(SinkStateError):
    """A batch id below the sink's last committed one: a new checkpoint or a second writer,
    never a replay (Spark replays only the last batch). Nothing was written."""
