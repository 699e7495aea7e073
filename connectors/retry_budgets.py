"""The retry budgets of every system the connectors talk to, side by side (docs/design.md,
"Retry budgets: one rule"; docs/deploying.md shows :func:`docs_table`).

One rule for all of them:

1. a **first contact** (nothing at that address answered this process yet) is bounded by the
   system's ``connectTimeout`` and fails naming the address and the setting to check
   (:mod:`connectors.core.contact`);
2. an **outage** of a system that answered before is ridden through within a budget sized for
   the restarts, failovers, elections and brownouts production meets, the figure named beside
   it (:data:`BUDGETS`);
3. a **spent budget** fails with how long, how many attempts and which option to raise.

Each row points at the options' own declarations, so the defaults shown are the defaults
used; only the reasons are written here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from connectors.core.declared import Opt
from connectors.core.storage.options import STORAGE_OPTIONS, StorageOptionSpec, shown_default
from connectors.jdbc.options import JDBC_SINK_OPTIONS
from connectors.kafka.common import CONNECT_TIMEOUT, METADATA_RETRY_TIMEOUT
from connectors.kafka.sink.options import KAFKA_SINK_OPTIONS
from connectors.kafka.source.declaration import POLL_TIMEOUT

Declared = Opt | StorageOptionSpec


@dataclass(frozen=True)
class Budget:
    """One system's two budgets and what the outage one is sized for."""

    system: str
    #: bounds the first contact (None: nothing to mistype, a local file)
    first_contact: Declared | None
    #: bound the outage of a system that answered before
    outage: tuple[Declared, ...]
    #: what the outage budget's default rides through (markdown)
    sized_for: str
    #: what the first contact's default allows for (markdown)
    first_contact_note: str = ""


def _jdbc(name: str) -> Opt:
    return next(o for o in JDBC_SINK_OPTIONS if o.spark == name)


def _storage(name: str) -> StorageOptionSpec:
    return next(o for o in STORAGE_OPTIONS if o.name == name)


def _kafka_sink(name: str) -> Opt:
    return next(o for o in KAFKA_SINK_OPTIONS if o.spark == name)


BUDGETS: tuple[Budget, ...] = (
    Budget("Kafka (source and sink)", CONNECT_TIMEOUT,
           (METADATA_RETRY_TIMEOUT, POLL_TIMEOUT, _kafka_sink("flushTimeout")),
           "a partition leader's election after a broker dies (the broker is fenced after "
           "`broker.session.timeout.ms`, 9 s), a controller or coordinator moving, a rolling "
           "restart one broker at a time; a produce is given librdkafka's "
           "`kafka.message.timeout.ms` (300 s), Kafka's Java producer 120 s "
           "(`delivery.timeout.ms`)",
           "a bootstrap list whose first brokers are down, a TLS and SASL handshake far "
           "away; a handshake or authentication refused fails at once"),
    Budget("PostgreSQL, MariaDB, MySQL (`eo_jdbc`)", _jdbc("connectTimeout"),
           (_jdbc("retryTimeout"), _jdbc("maxRetries")),
           "a failover (Patroni: a 30 s leader TTL, then the promotion; a managed database's "
           "Multi-AZ failover: 60-120 s), a restart for maintenance, sessions killed, "
           "deadlocks and lock timeouts"),
    Budget("SQLite (`eo_jdbc`)", None, (_jdbc("retryTimeout"),),
           "another writer holding the database file's lock"),
    Budget("HDFS (WebHDFS)", _storage("connectTimeout"),
           (_storage("retryTimeout"), _storage("maxRetries")),
           "a NameNode's restart: its start-up, then safe mode for at least "
           "`dfs.namenode.safemode.extension` (30 s) after the block reports; a DataNode's "
           "restart; a standby NameNode becoming active"),
    Budget("Object stores (S3, GCS, Azure Blob)", _storage("connectTimeout"),
           (_storage("retryTimeout"), _storage("maxRetries")),
           "an S3-compatible server's restart (SeaweedFS: up to 40 s on a busy machine), "
           "throttling (503 SlowDown), a load balancer's brownout; obstore's own default "
           "is 3 minutes"),
    Budget("Local disks", None, (_storage("retryTimeout"), _storage("maxRetries")),
           "a full disk someone frees (or a quota someone raises)"),
)


def _name(o: Declared) -> str:
    return f"`{o.spark}`" if isinstance(o, Opt) else f"`storage.{o.name}`"


def _default(o: Declared) -> str:
    if isinstance(o, StorageOptionSpec):
        return shown_default(o)
    if o.spark.endswith("Ms"):  # Spark's own millisecond options (pollTimeoutMs)
        return f"`{int(o.default)}` ({int(o.default) / 1000:g} s)"
    return str(o.kind.shown(o.default))


def _options(options: tuple[Any, ...]) -> str:
    return ", ".join(f"{_name(o)} {_default(o)}" for o in options)


def docs_table() -> str:
    """The markdown table of docs/deploying.md, "Retry budgets"."""
    rows = ["| system | first contact (nothing answered this process yet) | outage of what "
            "answered before | the outage budget is sized for |", "|---|---|---|---|"]
    for b in BUDGETS:
        if b.first_contact is None:
            first = "none: no address to get wrong"
        else:
            first = _options((b.first_contact,))
            if b.first_contact_note:
                first += f": {b.first_contact_note}"
        rows.append(f"| {b.system} | {first} | {_options(b.outage)} | {b.sized_for} |")
    return "\n".join(rows) + "\n"
