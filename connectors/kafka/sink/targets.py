"""The sink's view of its cluster: can it be reached, do the target topics exist, how many
partitions do they have (routing depends on it).

A target topic that does not exist is looked up without creating it. By default the sink
then warns once per topic and process and lets the broker create it with its defaults (when
``auto.create.topics.enable`` allows it, as Spark's own Kafka sink does); with
``failOnUnknownTopic=true`` it fails instead, naming the topic, and nothing is created.
"""

from __future__ import annotations

import logging
import threading

from connectors.core.errors import KafkaSinkError
from connectors.core.retry import poll_until
from connectors.kafka import access, clients, preflight
from connectors.kafka.clients import TopicInfo
from connectors.kafka.common import FAMILY, retrying
from connectors.kafka.sink import commit_facts
from connectors.kafka.sink.options import KafkaSinkOptions
from connectors.kafka.wire.protocol import RETRIABLE, WireError

log = logging.getLogger(__name__)

#: Seconds a target topic may be unknown to the broker's metadata before the sink calls it
#: missing (a topic created a moment ago is not in every broker's metadata cache yet).
UNKNOWN_TOPIC_GRACE = 10.0
#: The same, before the default mode warns and lets the broker create the topic.
UNKNOWN_TOPIC_GRACE_WARN = 2.0

#: UNKNOWN_TOPIC_OR_PARTITION: the topic does not exist (yet).
UNKNOWN_TOPIC = 3

_WARNED: set[tuple[str, str]] = set()
_WARNED_LOCK = threading.Lock()


def check_reachable(options: KafkaSinkOptions, started: float | None = None) -> None:
    """The first request to the cluster, bounded by ``connectTimeout`` from ``started``
    (default: now; :func:`connectors.kafka.connect.first_contact`): an unreachable or
    misconfigured cluster fails in that time with one error naming the bootstrap servers
    and the likely cause. With a ``topic`` option it asks for that topic's metadata only,
    not the whole cluster's (which is large on a cluster with many topics)."""
    with clients.lease(options.producer_conf) as cluster:
        cluster.first_contact(who=f"{FAMILY} sink {options.sink_id}", topic=options.topic,
                              timeout=options.connect_timeout, error=KafkaSinkError,
                              started=started)


def check_access(options: KafkaSinkOptions) -> None:
    """A missing ACL of the sink's role fails here, naming it, before any task writes (the
    driver's last check: the facts topic exists by then)."""
    preflight.preflight(options.producer_conf, needs(options),
                        who=f"{FAMILY} sink {options.sink_id}",
                        timeout=options.connect_timeout, error=KafkaSinkError,
                        retry_timeout=options.metadata_retry_timeout)


def needs(options: KafkaSinkOptions) -> list[tuple[access.Acl, str]]:
    """The ACLs of the sink's role (docs/security.md) that a Describe can check: those on
    the ``topic`` option's topic (a ``topic`` column's topics are checked by their first
    request)."""
    role = "transactional-sink" if options.transactional else "sink"
    names = {"topic": options.topic or "", "sink_id": options.sink_id,
             "facts_topic": options.facts_topic}
    out = []
    for acl in access.ROLES[role]:
        bound = acl.bind(**names)
        if acl.operation == "CREATE":
            continue  # needed only while the facts topic is missing: ensure_facts_topic
        if acl.resource == "TOPIC" and "{topic}" in acl.name and options.topic:
            out.append((bound, options.topic))
        elif acl.resource == "TOPIC" and "{facts_topic}" in acl.name:
            out.append((bound, options.facts_topic))
        elif acl.resource == "GROUP":
            out.append((bound, commit_facts.group_id(options.sink_id, 0)))  # writer 0's
    return out


def ensure_facts_topic(options: KafkaSinkOptions) -> None:
    """The transactional mode's facts topic exists (created with one partition when it does
    not): the broker refuses commit facts for a topic it does not know."""
    from connectors.kafka.sink.commit_facts import ensure_facts_topic as ensure

    topic = options.facts_topic
    try:
        retrying(lambda: ensure(options.producer_conf, topic, options.connect_timeout),
                 what=f"{FAMILY} sink {options.sink_id}: facts topic {topic!r}",
                 error=KafkaSinkError, timeout=options.metadata_retry_timeout)
    except KafkaSinkError as e:
        create = [a.bind(facts_topic=topic) for a in access.ROLES["transactional-sink"]
                  if a.operation == "CREATE"]
        denied = access.denied(e.__cause__ or e, who=f"{FAMILY} sink {options.sink_id}",
                               conf=options.producer_conf, needs=create,
                               request=f"creating the facts topic {topic!r} (factsTopic)")
        if denied is not None:
            raise KafkaSinkError(f"{denied}; or create the topic with one partition "
                                 "yourself") from None
        failed = KafkaSinkError(
            f"{e}; the transactional mode keeps its commit facts as offsets on topic "
            f"{topic!r} (factsTopic): create it with one partition, or let the sink create it "
            "(CREATE on that topic), docs/security.md")
        failed.unreachable = e.unreachable
        raise failed from None


def partition_counts(options: KafkaSinkOptions, topics: list[str]) -> dict[str, int]:
    """The partition count of every target topic; a missing one is created by the broker
    (with a warning) or refused (``failOnUnknownTopic=true``)."""
    out: dict[str, int] = {}
    for t in topics:
        grace = UNKNOWN_TOPIC_GRACE if options.fail_on_unknown_topic else UNKNOWN_TOPIC_GRACE_WARN
        info = _await_topic(options, t, grace, auto_create=False)
        if info is None:
            if options.fail_on_unknown_topic:
                raise KafkaSinkError(
                    f"{FAMILY} sink {options.sink_id}: target topic {t!r} does not exist and "
                    "failOnUnknownTopic=true; create it first (for example kafka-topics.sh "
                    f"--create --topic {t} --partitions N), or drop failOnUnknownTopic to let "
                    "the broker create it with its default settings"
                )
            _warn_creating(options, t)
            info = _await_topic(options, t, UNKNOWN_TOPIC_GRACE, auto_create=True)
        if info is not None and info.error:
            role = "transactional-sink" if options.transactional else "sink"
            needs = [a.bind(topic=t, sink_id=options.sink_id, facts_topic=options.facts_topic)
                     for a in access.ROLES[role] if a.name == "{topic}"]
            denied = access.denied(WireError(f"metadata of {t!r}", info.error),
                                   who=f"{FAMILY} sink {options.sink_id}",
                                   conf=options.producer_conf, needs=needs,
                                   request=f"metadata of target topic {t!r}")
            if denied is not None:
                raise KafkaSinkError(denied)
        if info is None or info.error or not info.partitions:
            why = WireError("", info.error).name if info is not None else "unknown topic"
            raise KafkaSinkError(
                f"{FAMILY} sink {options.sink_id}: target topic {t!r} is not available "
                f"({why}); create it first (the sink routes every record itself and needs the "
                "topic's partition count), or enable auto.create.topics.enable on the broker"
            )
        out[t] = info.partitions
    return out


def _await_topic(options: KafkaSinkOptions, topic: str, grace: float,
                 auto_create: bool) -> TopicInfo | None:
    """The topic's metadata (the process's cluster keeps it), asked again for up to
    ``grace`` seconds while the broker calls it unknown (KRaft propagates a new topic
    asynchronously); None if it stays unknown."""
    who = f"{FAMILY} sink {options.sink_id}"

    def metadata() -> TopicInfo:
        with clients.lease(options.producer_conf) as cluster:
            info = cluster.topics([topic], who=who, error=KafkaSinkError,
                                  timeout=options.metadata_retry_timeout,
                                  auto_create=auto_create)[topic]
        if info.error in RETRIABLE and info.error != UNKNOWN_TOPIC:
            # A topic created a moment ago has no leader yet: ask again.
            raise WireError(f"{who}: metadata of topic {topic!r}", info.error)
        return info

    def known() -> TopicInfo | None:
        info = retrying(metadata, what=f"{who}: metadata of topic {topic!r}",
                        error=KafkaSinkError, timeout=options.metadata_retry_timeout)
        return None if info.error == UNKNOWN_TOPIC else info

    return poll_until(known, timeout=grace, interval=0.2)


def _warn_creating(options: KafkaSinkOptions, topic: str) -> None:
    key = (str(options.producer_conf.get("bootstrap.servers")), topic)
    with _WARNED_LOCK:
        if key in _WARNED:
            return
        _WARNED.add(key)
    log.warning("%s sink %s: target topic %r does not exist; the broker creates it with its "
                "default partition count and settings (auto.create.topics.enable). Create it "
                "yourself first, or set failOnUnknownTopic=true to refuse unknown topics",
                FAMILY, options.sink_id, topic)
