"""The source's view of its Kafka clusters, on the driver: metadata, offsets, group commits.

One admin client and one group committer per cluster, created on first use and never
pickled (the Spark reader that owns them travels to executors). Every answer is keyed by
``TP = (cluster, topic, partition)``; offsets are next offsets to read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from connectors.core.errors import KafkaSourceError
from connectors.kafka import access, preflight
from connectors.kafka.common import LIBRDKAFKA_LOG, attempt_timeout, retrying
from connectors.kafka.connect import first_contact, watched_admin
from connectors.kafka.source.offsets import TP, Offsets, tp_name
from connectors.kafka.source.options import ClusterSpec, KafkaSourceOptions

log = logging.getLogger(__name__)

#: librdkafka's "no offset" (RD_KAFKA_OFFSET_INVALID).
OFFSET_INVALID = -1001


class Clusters:
    """Driver-side clients of every cluster of one source."""

    def __init__(self, opts: KafkaSourceOptions) -> None:
        self.opts = opts
        self._admins: dict[str, Any] = {}
        self._committers: dict[str, Any] = {}
        self._reached: set[str] = set()  # clusters that answered once (see _first_contact)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_admins"] = {}
        state["_committers"] = {}
        state.pop("_wires", None)
        return state

    # -- clients ---------------------------------------------------------------------------
    def admin(self, cluster: ClusterSpec) -> Any:
        client = self._admins.get(cluster.name)
        if client is None:
            conf: dict[str, Any] = {k: v for k, v in cluster.kafka.items() if _admin_key(k)}
            conf["logger"] = LIBRDKAFKA_LOG
            client = watched_admin(conf)
            self._admins[cluster.name] = client
        return client

    def drop_admin(self, cluster: ClusterSpec) -> None:
        """Forget the cluster's admin client (its view of the leaders is stale); the next
        request makes a new one."""
        self._admins.pop(cluster.name, None)

    def committer(self, cluster: ClusterSpec) -> Any:
        """A consumer in the source's group; it only commits offsets, never subscribes."""
        client = self._committers.get(cluster.name)
        if client is None:
            from confluent_kafka import Consumer

            conf: dict[str, Any] = dict(cluster.reader_conf(self.opts.group_id))
            conf["group.id"] = self.opts.group_id
            # read_committed makes its OffsetFetch ask with require_stable, whatever the
            # source reads: a plain one, right after the group's coordinator moved, can answer
            # older state than the group's commits (lookup.stable_committed), and
            # startingOffsets=group would start over at earliest. The group's own commits
            # are never transactional, so nothing holds a stable fetch.
            conf["isolation.level"] = "read_committed"
            conf["logger"] = LIBRDKAFKA_LOG
            client = Consumer(conf)
            self._committers[cluster.name] = client
        return client

    def close(self) -> None:
        for c in self._committers.values():
            try:
                c.close()
            except Exception:  # noqa: BLE001, S110 - closing on stop; nothing to recover
                pass
        self._committers = {}
        self._admins = {}
        for client in self.__dict__.pop("_wires", {}).values():
            if client is not None:
                client.close()


    # -- metadata and offsets ---------------------------------------------------------------
    def partitions(self) -> dict[TP, None]:
        """Current partitions matched by every cluster's subscription (sorted)."""
        out: dict[TP, None] = {}
        started = time.monotonic()
        for c in self.opts.clusters:
            def metadata(c: ClusterSpec = c) -> Any:
                return self.admin(c).list_topics(
                    timeout=attempt_timeout(self.opts.poll_timeout))

            if c.name not in self._reached:
                self._first_contact(c, started)
            md = retrying(
                metadata,
                what=f"eo_kafka: listing the topics of cluster {c.name or c.bootstrap}",
                error=KafkaSourceError, timeout=self.opts.metadata_retry_timeout,
            )
            named = set(c.subscribe) | {t for t, _ in c.assign}
            missing = sorted(t for t in named if t not in md.topics
                             or md.topics[t].error is not None)
            self._warn_missing(c, missing)
            if c.assign:
                for t, p in c.assign:
                    meta = md.topics.get(t)
                    if meta is not None and meta.error is None and p in meta.partitions:
                        out[(c.name, t, p)] = None
                continue
            for topic, meta in md.topics.items():
                if meta.error is not None or topic.startswith("__"):
                    continue
                if c.matches(topic):
                    for p in meta.partitions:
                        out[(c.name, topic, p)] = None
        return dict.fromkeys(sorted(out))

    def _first_contact(self, c: ClusterSpec, started: float) -> None:
        """The first metadata request to a cluster, bounded by ``connectTimeout`` from
        ``started`` (:func:`connectors.kafka.connect.first_contact`): an unreachable or
        misconfigured cluster fails in that time with one error that names the bootstrap
        servers and the likely cause, instead of after the poll and retry deadlines
        (minutes) and thousands of librdkafka connection logs."""
        admin = self.admin(c)
        first_contact(admin, lambda seconds: admin.list_topics(timeout=seconds),
                      timeout=self.opts.connect_timeout, who="eo_kafka", bootstrap=c.bootstrap,
                      conf=c.kafka, error=KafkaSourceError, where="from the Spark driver",
                      started=started)
        # A missing ACL fails here, naming it, before any window is planned or read.
        preflight.preflight(c.kafka, self.needs(c), who="eo_kafka",
                            timeout=self.opts.connect_timeout, error=KafkaSourceError,
                            retry_timeout=self.opts.metadata_retry_timeout)
        self._reached.add(c.name)

    def needs(self, c: ClusterSpec) -> list[tuple[access.Acl, str]]:
        """The source role's ACLs (docs/security.md) on the named topics and the group."""
        out = []
        for acl in access.ROLES["source"]:
            if acl.resource == "GROUP":
                out.append((acl.bind(group=self.opts.group_id), self.opts.group_id))
            else:
                out += [(acl.bind(topic=t), t)
                        for t in sorted(set(c.subscribe) | {t for t, _ in c.assign})]
        return out

    def _warn_missing(self, c: ClusterSpec, missing: list[str]) -> None:
        """A subscribed topic that does not exist yields 0 rows: say so, once per topic
        (it is read from its first offset as soon as it appears)."""
        warned: set[tuple[str, str]] = self.__dict__.setdefault("_missing_warned", set())
        for t in missing:
            if (c.name, t) not in warned:
                warned.add((c.name, t))
                log.warning("eo_kafka: topic %r does not exist on %s; it yields no rows until "
                            "it is created (check the name in subscribe/assign)", t,
                            c.name or c.bootstrap)

    def wire(self, cluster: ClusterSpec) -> Any:
        """The wire client of ``cluster`` (:mod:`connectors.kafka.wire`), or None where it
        cannot connect the way librdkafka would (a GSSAPI login, ...)."""
        from connectors.kafka.wire.cluster import Cluster
        from connectors.kafka.wire.settings import Settings, connection_unsupported

        wires = self.__dict__.setdefault("_wires", {})
        if cluster.name not in wires:
            conf = {k: v for k, v in cluster.kafka.items() if _admin_key(k)}
            wires[cluster.name] = None if connection_unsupported(conf) is not None else Cluster(
                Settings.of(conf, client_id="eo-kafka-source"), "eo_kafka",
                self.opts.metadata_retry_timeout)
        return wires[cluster.name]

    def _list_offsets(self, tps: list[TP], timestamp: Any) -> Offsets:
        """ListOffsets of ``tps``: ``timestamp(tp)`` is -1 (the end: the last stable offset
        under read_committed), -2 (the start) or milliseconds (the first offset at or after
        it; -1 where there is none). Over the wire client, each partition asked of its
        leader and asked again after fresh metadata while its leader moves, until
        ``metadataRetryTimeout``; librdkafka's admin client only where the wire client
        cannot connect (docs/design.md, "Kafka nodes that move or go away")."""
        from connectors.kafka.wire import admin
        from connectors.kafka.wire.protocol import UnsupportedBroker, WireError

        out: Offsets = {}
        for c in self.opts.clusters:
            mine = [tp for tp in tps if tp[0] == c.name]
            if not mine:
                continue
            committed = c.reader_conf(self.opts.group_id)["isolation.level"] == "read_committed"
            names = [tp_name(tp) for tp in mine]
            what = (f"eo_kafka: ListOffsets on cluster {c.name or c.bootstrap} for "
                    f"{names[:5]}{' ...' if len(names) > 5 else ''}")
            client = self.wire(c)
            if client is not None:
                try:
                    got = admin.list_offsets(
                        client, {(tp[1], tp[2]): int(timestamp(tp)) for tp in mine},
                        admin.READ_COMMITTED if committed else admin.READ_UNCOMMITTED,
                        timeout=self.opts.metadata_retry_timeout)
                except UnsupportedBroker:
                    self.__dict__["_wires"][c.name] = None  # older broker: librdkafka
                except WireError as e:
                    raise KafkaSourceError(f"{what} failed: {e}") from None
                else:
                    out.update({(c.name, t, p): o for (t, p), o in got.items()})
                    continue
            out.update(self._list_offsets_librdkafka(c, mine, timestamp, committed, what))
        return out

    def _list_offsets_librdkafka(self, c: ClusterSpec, mine: list[TP], timestamp: Any,
                                 committed: bool, what: str) -> Offsets:
        from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
        from confluent_kafka.admin import OffsetSpec

        def spec(ts: int) -> Any:
            return (OffsetSpec.latest() if ts == -1 else OffsetSpec.earliest() if ts == -2
                    else OffsetSpec.for_timestamp(ts))

        isolation = (IsolationLevel.READ_COMMITTED if committed
                     else IsolationLevel.READ_UNCOMMITTED)
        request = {TopicPartition(tp[1], tp[2]): spec(int(timestamp(tp))) for tp in mine}

        def list_offsets() -> Offsets:
            futures = self.admin(c).list_offsets(
                request, isolation_level=isolation,
                request_timeout=attempt_timeout(self.opts.poll_timeout),
            )
            try:
                got = {(c.name, ktp.topic, ktp.partition): fut.result().offset
                       for ktp, fut in futures.items()}
            except KafkaException:
                # librdkafka's admin client keeps a partition it saw without a leader
                # "permanently" so, answering LEADER_NOT_AVAILABLE until its metadata cache
                # expires: the next try asks with a new client (new metadata).
                self.drop_admin(c)
                raise
            invalid = [tp_name(tp) for tp, offset in got.items() if offset == OFFSET_INVALID]
            if invalid:
                # A partition whose leader just moved can come back with no offset and no
                # error: asked again with a new client, never read as "the log ends at -1001".
                self.drop_admin(c)
                raise KafkaException(KafkaError(
                    KafkaError.LEADER_NOT_AVAILABLE,
                    f"ListOffsets gave no offset for {invalid[:5]}", retriable=True))
            return got

        return retrying(list_offsets, what=what, error=KafkaSourceError,
                        timeout=self.opts.metadata_retry_timeout)

    def latest(self, tps: list[TP]) -> Offsets:
        """High watermarks (the last stable offset under read_committed)."""
        return self._list_offsets(tps, lambda _tp: -1)

    def earliest(self, tps: list[TP]) -> Offsets:
        return self._list_offsets(tps, lambda _tp: -2)

    def for_times(self, times: Mapping[TP, int]) -> Offsets:
        """First offset with timestamp >= the given millis; -1 where there is none."""
        return self._list_offsets(list(times), lambda tp: times[tp])

    def group_offsets(self, cluster: ClusterSpec, tps: list[TP]) -> Offsets:
        """The source group's committed offsets (absent where the group has none)."""
        from confluent_kafka import TopicPartition

        mine = [TopicPartition(t, p) for c, t, p in tps if c == cluster.name]
        if not mine:
            return {}
        got = retrying(
            lambda: self.committer(cluster).committed(
                mine, timeout=attempt_timeout(self.opts.poll_timeout)),
            what=f"eo_kafka: committed offsets of group {self.opts.group_id!r} on cluster "
                 f"{cluster.name or cluster.bootstrap}",
            error=KafkaSourceError, timeout=self.opts.metadata_retry_timeout,
        )
        return {(cluster.name, k.topic, k.partition): k.offset for k in got if k.offset >= 0}

    # -- starting and latest offsets -------------------------------------------------------

    def commit_group(self, offsets: Mapping[TP, int]) -> None:
        """Commit ``offsets`` (next offsets to read) to the source's consumer group.

        Failure only costs lag visibility, never correctness (Spark's checkpoint or the
        WAL drives replays), so it is logged, not raised.
        """
        from confluent_kafka import TopicPartition

        for c in self.opts.clusters:
            mine = [TopicPartition(t, p, o) for (cn, t, p), o in sorted(offsets.items())
                    if cn == c.name]
            if not mine:
                continue
            try:
                def commit(c: ClusterSpec = c, mine: list[Any] = mine) -> Any:
                    return self.committer(c).commit(offsets=mine, asynchronous=False)

                # Monitoring only: a short deadline, so a lost coordinator never stalls
                # planning for long.
                retrying(
                    commit,
                    what=f"eo_kafka: committing offsets to group {self.opts.group_id!r}",
                    error=KafkaSourceError, timeout=min(self.opts.metadata_retry_timeout, 10.0),
                )
            except Exception as e:  # noqa: BLE001 - monitoring only, see docstring
                denied = access.denied(
                    e.__cause__ or e, who="eo_kafka", conf=c.kafka,
                    needs=[a for a, _ in self.needs(c)],
                    request=f"committing offsets to group {self.opts.group_id!r}")
                if denied is not None:
                    # A missing ACL never cures itself: fail, naming it.
                    raise KafkaSourceError(denied) from None
                log.warning(
                    "eo_kafka: committing offsets to group %r on %s failed: %s",
                    self.opts.group_id, c.name or c.bootstrap, e,
                )



def _admin_key(key: str) -> bool:
    # Consumer-only settings make AdminClient warn; pass the connection/security ones.
    consumer_only = (
        "group.", "isolation.level", "auto.", "enable.auto", "enable.partition.eof",
        "queued.", "fetch.", "max.poll", "session.timeout", "heartbeat", "partition.assignment",
        "check.crcs", "group.id",
    )
    return not key.startswith(consumer_only)
