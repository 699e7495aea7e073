"""``eo-connectors doctor``: what this install can do and, when given, what a Kafka cluster
and a storage path serve, one line per check, each ``ok`` or what to do.

- **This install** (always): Python, pyspark, confluent-kafka and the librdkafka it loaded,
  each optional C extension setup.py builds (``install.EXTENSIONS``: built or not, and what
  runs without it) and the produce path the Kafka sink takes with them, then Java and Maven,
  which only the local services need (the demo's broker, the tests).
- **A cluster** (``--bootstrap``, with ``--kafka``/``--kafka-config`` for TLS and SASL):
  its brokers, and per broker the request versions it serves (``ApiVersions``, which Kafka
  answers before any login): the Kafka versions they imply, whether it serves the idempotent
  and transactional producer, whether it verifies a transaction's partitions (KIP-890,
  ``AddPartitionsToTxn`` v4, Kafka 3.6), which the wire path needs for transactions, and
  whether the wire path's request versions are all there.
- **The principal's ACLs** (``--topic``, ``--group``, ``--sink-id``): for every role of
  :data:`connectors.kafka.access.ROLES` (docs/security.md's tables) whose names are given,
  each ACL held or missing, with the command that grants it. Kafka reports the operations
  a principal holds on topics and groups (KIP-430); on transactional ids and the cluster it
  reports none, so those are named, not checked.
- **A storage path** (``--path``, with ``--storage KEY=VALUE``): the conditional-write probe
  every sink runs before its first commit (:func:`connectors.core.storage.check_create_if_absent`).

Read-only: no topic is created (metadata through a consumer that never auto-creates; a topic
is described only when the metadata lists it), no group is joined, nothing is produced or
committed. The one write is the storage probe the connectors themselves make: a
hidden object created twice and deleted.
"""

from __future__ import annotations

import argparse
import dataclasses
import posixpath
from typing import Any

from connectors.core.errors import ConnectorError
from connectors.doctor.checks import FAIL, OK, SKIP, WARN, Check

#: The roles of ``connectors.kafka.access.ROLES`` (a unit test holds them equal), spelled
#: out so that building the CLI's parser imports no Kafka module.
ROLE_NAMES = ("source", "source-group", "windows", "sink", "transactional-sink", "transactions",
              "lag")
#: The transactional Kafka sink's default ``factsTopic`` (a unit test holds it equal).
FACTS_TOPIC = "eo-sink-facts"

__all__ = ["FAIL", "OK", "SKIP", "WARN", "Check", "add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``doctor`` command's arguments (``--storage`` and ``--json`` come from the CLI)."""
    p.add_argument("--bootstrap", help="a Kafka cluster's bootstrap servers, host:port[,...]")
    p.add_argument("--topic", help="with --bootstrap: a source or sink topic whose ACLs to "
                   "check (never created)")
    p.add_argument("--group", help="with --bootstrap: a source's consumer group whose ACLs to "
                   "check")
    p.add_argument("--sink-id", help="with --bootstrap: a Kafka sink's sink_id (its "
                   "transactional ids and commit-fact groups)")
    p.add_argument("--role", action="append", choices=ROLE_NAMES, metavar="ROLE",
                   help="only this role's ACLs (repeatable; default: every role whose names "
                   f"are given): {', '.join(ROLE_NAMES)}, as in docs/security.md")
    p.add_argument("--facts-topic", default=FACTS_TOPIC, help="with --sink-id: the "
                   "transactional sink's factsTopic (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=15.0,
                   help="seconds each Kafka request may take (default: %(default)s)")
    p.add_argument("--kafka", action="append", metavar="KEY=VALUE",
                   help="a librdkafka setting (repeatable), e.g. security.protocol=SASL_SSL; "
                   "see docs/security.md")
    p.add_argument("--kafka-config", metavar="FILE", help="a file of KEY=VALUE settings")
    p.add_argument("--path", help="a walPath or output path whose conditional writes to "
                   "probe (local, hdfs://, webhdfs://, s3://, gs://, abfss://)")


def run(args: argparse.Namespace, settings: dict[str, str],
        storage: tuple[Any, str] | None) -> tuple[dict[str, Any], list[str], int]:
    """The checks ``args`` ask for: ``settings`` the ``--kafka`` settings, ``storage`` the
    backend and path of ``--path``. Returns :func:`report`'s document, lines and exit code."""
    from connectors.doctor import cluster, install

    if not args.bootstrap and (args.topic or args.group or args.sink_id or args.role):
        raise ConnectorError("doctor: --topic, --group, --sink-id and --role say which ACLs "
                             "to check, in the cluster that --bootstrap names; give --bootstrap")
    if storage is None and getattr(args, "storage", None):
        raise ConnectorError("doctor: --storage configures the store of --path; give --path")
    checks = install.install_checks(settings)
    if args.bootstrap:
        from connectors.kafka.common import LIBRDKAFKA_LOG

        conf: dict[str, Any] = {**settings, "bootstrap.servers": args.bootstrap,
                                "logger": LIBRDKAFKA_LOG}
        found, held = cluster.cluster_checks(conf, args.timeout)
        checks += found
        names = {k: v for k, v in (("topic", args.topic), ("group", args.group),
                                   ("sink_id", args.sink_id)) if v}
        if args.sink_id:
            names["facts_topic"] = args.facts_topic
        if held is not None:
            try:
                checks += cluster.acl_checks(held.client, conf, names, args.timeout,
                                             args.role or ())
            finally:
                held.release()
    if storage is not None:
        from connectors.core.options import redact_url

        checks.append(storage_check(*storage, redact_url(args.path)))
    return report(checks)


def storage_check(storage: Any, path: str, shown: str) -> Check:
    """The conditional-write probe the sinks run, in ``path`` (or, on a filesystem, the
    nearest directory that exists: the probe creates no directory)."""
    from connectors.core.storage import check_create_if_absent

    where = path
    while storage.atomic_rename and not storage.exists(where) and where != "/":
        where = posixpath.dirname(where.rstrip("/")) or "/"
    how = ("a conditional PUT (If-None-Match: *)" if not storage.atomic_rename
           else "a hard link or rename that refuses an existing name")
    try:
        check_create_if_absent(storage, where)
    except ConnectorError as e:
        # The store's own error says what to do (a bucket, credentials, an endpoint); only
        # a refused probe needs another store.
        refused = "create-if-absent" in str(e) or "atomically" in str(e)
        return Check("storage", f"storage {shown}", FAIL, str(e),
                     "use a store that enforces conditional writes, HDFS or a local path "
                     "(docs/deploying.md)" if refused else "")
    probed = "" if where == path else f" (probed in {storage.url(where)}, which exists)"
    return Check("storage", f"storage {shown}", OK,
                 f"{storage.kind}: create-if-absent enforced ({how}){probed}: the commit "
                 "points are safe here")


def report(checks: list[Check]) -> tuple[dict[str, Any], list[str], int]:
    """``(json document, text lines, exit code)``: 1 when any check FAILed."""
    failed = [c for c in checks if c.status == FAIL]
    titles = {"install": "this install", "kafka": "the cluster", "acl": "ACLs (docs/"
              "security.md)", "storage": "storage"}
    lines, area = [], ""
    for c in checks:
        if c.area != area:
            area = c.area
            lines.append(f"{titles.get(area, area)}:")
        lines.append(c.line())
    lines.append(f"{len(failed)} check(s) failed" if failed else "every check passed")
    doc = {"ok": not failed, "checks": [dataclasses.asdict(c) for c in checks]}
    return doc, lines, 1 if failed else 0
