"""The source's view of its Kafka clusters, on the driver: metadata, offsets, group commits.

Metadata and offsets come from the process's :class:`connectors.kafka.clients.KafkaCluster`
of each cluster (the wire client, else librdkafka: the choice is made there): its leaders
are kept between micro-batches, so a steady ``latestOffset`` is one ListOffsets per leader,
all sent at once, and a Metadata request only when the kept answer is older than the
discovery interval or a leader moved. One group committer (a librdkafka consumer that never
subscribes) per cluster commits the source's group, on a thread of its own
(:meth:`Clusters.commit_group_soon`): the round trip is off the planning path. Both are
created on first use and never pickled (the Spark reader that owns them travels to
executors). Every answer is keyed by ``TP = (cluster, topic, partition)``; offsets are next
offsets to read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from connectors.core.errors import KafkaSourceError
from connectors.kafka import access, clients, preflight
from connectors.kafka.common import LIBRDKAFKA_LOG, Lease, attempt_timeout, retrying
from connectors.kafka.source.offsets import TP, Offsets, tp_name
from connectors.kafka.source.options import ClusterSpec, KafkaSourceOptions

log = logging.getLogger(__name__)

#: How long the list of a cluster's partitions is kept between micro-batches (a new
#: partition, or a new topic matching ``subscribePattern``, is found within it):
#: ``kafka.topic.metadata.refresh.interval.ms`` where set (librdkafka's name for the same
#: interval), else this many seconds.
DISCOVERY_INTERVAL = 10.0


class Clusters:
    """Driver-side clients of every cluster of one source."""

    def __init__(self, opts: KafkaSourceOptions) -> None:
        self.opts = opts
        self._leases: dict[str, Lease[clients.KafkaCluster]] = {}
        self._committers: dict[str, Any] = {}
        self._reached: set[str] = set()  # clusters that answered once (see _first_contact)
        self._missing_warned: set[tuple[str, str]] = set()
        self._group_thread: ThreadPoolExecutor | None = None
        self._group_commit: Future[None] | None = None  # the one under way, if any

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_leases"] = {}
        state["_committers"] = {}
        state["_group_thread"] = state["_group_commit"] = None
        return state

    # -- clients ---------------------------------------------------------------------------
    def kafka(self, cluster: ClusterSpec) -> clients.KafkaCluster:
        """The process's :class:`~connectors.kafka.clients.KafkaCluster` of ``cluster``, held
        until :meth:`close`."""
        held = self._leases.get(cluster.name)
        if held is None:
            held = self._leases[cluster.name] = clients.acquire(cluster.kafka)
        return held.client

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
        try:
            self.settle_group_commit()
        except Exception as e:  # noqa: BLE001 - on stop: the last commit's failure is only told
            log.warning("eo_kafka: the last group commit failed: %s", e)
        if self._group_thread is not None:
            self._group_thread.shutdown(wait=True)
            self._group_thread = None
        for c in self._committers.values():
            try:
                c.close()
            except Exception:  # noqa: BLE001, S110 - closing on stop; nothing to recover
                pass
        self._committers = {}
        for held in self._leases.values():
            held.release()
        self._leases = {}

    # -- metadata and offsets ---------------------------------------------------------------
    def partitions(self) -> dict[TP, None]:
        """Current partitions matched by every cluster's subscription (sorted), from
        metadata at most :func:`discovery_interval` old."""
        out: dict[TP, None] = {}
        started = time.monotonic()
        for c in self.opts.clusters:
            if c.name not in self._reached:
                self._first_contact(c, started)
            named = sorted(set(c.subscribe) | {t for t, _ in c.assign})
            topics = self.kafka(c).topics(
                named if named else None, who="eo_kafka", error=KafkaSourceError,
                timeout=self.opts.metadata_retry_timeout, max_age=discovery_interval(c))
            missing = [t for t in named if t not in topics or topics[t].error]
            self._warn_missing(c, missing)
            if c.assign:
                for t, p in c.assign:
                    meta = topics.get(t)
                    if meta is not None and not meta.error and p < meta.partitions:
                        out[(c.name, t, p)] = None
                continue
            for topic, meta in topics.items():
                if meta.error or topic.startswith("__"):
                    continue
                if c.matches(topic):
                    for p in range(meta.partitions):
                        out[(c.name, topic, p)] = None
        return dict.fromkeys(sorted(out))

    def _first_contact(self, c: ClusterSpec, started: float) -> None:
        """The first metadata request to a cluster, bounded by ``connectTimeout`` from
        ``started`` (:meth:`connectors.kafka.clients.KafkaCluster.first_contact`): an
        unreachable or misconfigured cluster fails in that time with one error that names the
        bootstrap servers and the likely cause, instead of after the poll and retry deadlines
        (minutes) and thousands of librdkafka connection logs."""
        self.kafka(c).first_contact(who="eo_kafka", timeout=self.opts.connect_timeout,
                                    error=KafkaSourceError, where="from the Spark driver",
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
        for t in missing:
            if (c.name, t) not in self._missing_warned:
                self._missing_warned.add((c.name, t))
                log.warning("eo_kafka: topic %r does not exist on %s; it yields no rows until "
                            "it is created (check the name in subscribe/assign)", t,
                            c.name or c.bootstrap)

    def _list_offsets(self, tps: list[TP], timestamp: Any, fresh: bool = False) -> Offsets:
        """ListOffsets of ``tps``: ``timestamp(tp)`` is -1 (the end: the last stable offset
        under read_committed), -2 (the start) or milliseconds (the first offset at or after
        it; -1 where there is none), through the process's cluster (docs/design.md, "Kafka
        nodes that move or go away"). ``fresh``: the leaders are looked up again first."""
        out: Offsets = {}
        for c in self.opts.clusters:
            mine = [tp for tp in tps if tp[0] == c.name]
            if not mine:
                continue
            if fresh:
                self.kafka(c).forget_leaders({tp[1] for tp in mine})
            committed = c.reader_conf(self.opts.group_id)["isolation.level"] == "read_committed"
            names = [tp_name(tp) for tp in mine]
            what = (f"eo_kafka: ListOffsets on cluster {c.name or c.bootstrap} for "
                    f"{names[:5]}{' ...' if len(names) > 5 else ''}")
            # gone_ok: the partition list is kept up to the discovery interval, so a topic
            # deleted since is found here; left out, the planner reports the data loss.
            got = self.kafka(c).list_offsets(
                {(tp[1], tp[2]): int(timestamp(tp)) for tp in mine}, committed=committed,
                who="eo_kafka", error=KafkaSourceError, timeout=self.opts.metadata_retry_timeout,
                what=what, gone_ok=True)
            out.update({(c.name, t, p): o for (t, p), o in got.items()})
        return out

    def latest(self, tps: list[TP], fresh: bool = False) -> Offsets:
        """High watermarks (the last stable offset under read_committed); ``fresh``: from
        leaders looked up again."""
        return self._list_offsets(tps, lambda _tp: -1, fresh)

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

    def commit_group_soon(self, offsets: Mapping[TP, int]) -> None:
        """:meth:`commit_group` on the committer's thread: the planner does not wait for the
        OffsetCommit's round trip (about 10 ms, two thirds of a steady micro-batch's planning;
        bench/source_throughput.py). Commits stay in order and at most one is under way: this
        waits for the previous one first, and raises the denial it met (a missing ACL); the
        last one is waited for by :meth:`close`. The group is for lag tools and
        ``startingOffsets=group`` only (the WAL or Spark's checkpoint drives replays), so it
        may trail the WAL by one commit's round trip."""
        self.settle_group_commit()
        if self._group_thread is None:
            self._group_thread = ThreadPoolExecutor(1, thread_name_prefix="eo-kafka-group-commit")
        self._group_commit = self._group_thread.submit(self.commit_group, dict(offsets))

    def settle_group_commit(self) -> None:
        """Wait for the group commit under way, if any; raise what it raised."""
        pending, self._group_commit = self._group_commit, None
        if pending is not None:
            pending.result()

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



def discovery_interval(c: ClusterSpec) -> float:
    """Seconds the partition list of ``c`` is kept (:data:`DISCOVERY_INTERVAL`)."""
    ms = c.kafka.get("topic.metadata.refresh.interval.ms")
    return DISCOVERY_INTERVAL if ms is None else max(int(ms), 0) / 1000.0
