"""The ACL preflight: before a source or sink reads or writes anything, ask the cluster
whether the principal holds the ACLs its role needs (:data:`connectors.kafka.access.ROLES`),
and fail with the one message that names the missing ACL and how to grant it.

The check must never be what stops a query: it is retried while a node restarts, skipped
when its answer stays unknown, and not asked again on a cluster that grants everything.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from connectors.kafka import access

log = logging.getLogger(__name__)

#: The operations Kafka reports for a topic or group when nothing is denied.
_ALL_OPERATIONS = {
    "TOPIC": {"READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "DESCRIBE_CONFIGS",
              "ALTER_CONFIGS"},
    "GROUP": {"READ", "DESCRIBE", "DELETE"},
}
#: The longest one request of the preflight may take before it is asked again.
PREFLIGHT_REQUEST_TIMEOUT = 10.0


def preflight(conf: Mapping[str, Any], checks: Sequence[tuple[access.Acl, str]], *,
              who: str, timeout: float, error: type[Exception],
              retry_timeout: float | None = None) -> None:
    """Fail before anything is read or written when the principal lacks an ACL of
    ``checks``: ``(acl, concrete name)`` pairs (a prefixed ACL is checked on one name it
    covers). Topics and groups report the principal's authorized operations (KIP-430): a
    Metadata v8 of the topics from any live broker, a DescribeGroups of each group to its
    coordinator. A topic that does not exist is left to the caller. ACLs on transactional
    ids and the cluster cannot be asked about this way: their first request
    (InitProducerId) fails with the same message instead.

    The requests go over the wire client (:mod:`connectors.kafka.wire.admin`), never
    librdkafka's admin client, whose Describe requests wait on the controller or a
    coordinator in a way that aborted the process under node kills (docs/design.md, "Kafka
    nodes that move or go away"). With a connection setting the wire client cannot honour
    (a GSSAPI or OAUTHBEARER login, ...) the check is skipped, logged once.

    The check must never be what stops a query: a cluster without an authorizer (every
    operation granted on everything described) is not asked again in this process; a
    request that meets a node restarting or moving is asked again, each try bounded by
    :data:`PREFLIGHT_REQUEST_TIMEOUT`, until ``retry_timeout`` (``metadataRetryTimeout``);
    if the answer is still unknown then, the check is skipped with a warning (a missing ACL
    still fails the first request that needs it, naming it). Only an answer that says
    "denied" fails here."""
    from connectors.kafka import clients
    from connectors.kafka.wire.protocol import RETRIABLE, WireError

    topics = sorted({n for a, n in checks if a.resource == "TOPIC"})
    groups = sorted({n for a, n in checks if a.resource == "GROUP"})
    if not topics and not groups:
        return
    with clients.lease(conf) as kafka:
        wire = kafka.lookups()
        if kafka.grants_everything:
            return
        if wire is None:
            clients.note_once(f"{who}: the ACL check before the first read or write is "
                              f"skipped on {kafka.bootstrap}: the wire client does not "
                              f"connect with {kafka.wire_refusal}; a missing ACL fails the "
                              "first request that needs it, naming it")
            return
        budget = retry_timeout if retry_timeout is not None else timeout
        try:
            got = _describe(wire, topics, groups, who, budget)
        except WireError as e:
            if e.code not in RETRIABLE:
                raise error(f"{who}: checking ACLs before the first read or write: {e}") from e
            log.warning("%s: the ACL check is skipped, its answer is unknown (%s); a missing "
                        "ACL fails the first request that needs it, naming it", who, e)
            return
        if got and all(isinstance(answer, set) and _ALL_OPERATIONS[kind] <= answer
                       for (kind, _), answer in got.items()):
            kafka.grants_everything = True
            return
    missing = _missing(checks, got)
    if missing:
        from confluent_kafka import KafkaError, KafkaException

        kind = access.AUTHORIZATION_CODE[missing[0].resource]
        message = access.denied(KafkaException(KafkaError(kind)), who=who, conf=conf,
                                needs=[a for a in missing if a.resource == missing[0].resource],
                                request="checking ACLs before the first read or write")
        raise error(message)


#: What the cluster said of one topic or group: the operations granted, a denial, or None
#: (it does not exist, or told nothing to judge by).
Answer = set[str] | Exception | None


def _describe(cluster: Any, topics: list[str], groups: list[str], who: str,
              timeout: float) -> dict[tuple[str, str], Answer]:
    from connectors.kafka.wire import admin
    from connectors.kafka.wire.protocol import WireError

    got: dict[tuple[str, str], Answer] = {}
    described = admin.describe_topics(cluster, topics, timeout, who) if topics else {}
    for name, meta in described.items():
        if meta.error == 3:  # UNKNOWN_TOPIC_OR_PARTITION: the caller's rules apply
            got[("TOPIC", name)] = None
        elif meta.error in access.AUTHORIZATION_CODE.values():
            got[("TOPIC", name)] = WireError(f"{who}: Metadata of {name!r}", meta.error)
        else:
            got[("TOPIC", name)] = admin.operations(meta.authorized)
    groups_found = admin.describe_groups(cluster, groups, timeout, who) if groups else {}
    for name, group in groups_found.items():
        if group.error in access.AUTHORIZATION_CODE.values():
            got[("GROUP", name)] = WireError(f"{who}: DescribeGroups of {name!r}", group.error)
        elif group.error or group.authorized is None:
            got[("GROUP", name)] = None  # GROUP_ID_NOT_FOUND: nothing to judge by
        else:
            got[("GROUP", name)] = admin.operations(group.authorized)
    return got


def _missing(checks: Sequence[tuple[access.Acl, str]],
             got: Mapping[tuple[str, str], Answer]) -> list[access.Acl]:
    """The ACLs of ``checks`` the answers show missing."""
    missing: list[access.Acl] = []
    for acl, name in checks:
        if acl.resource not in ("TOPIC", "GROUP"):
            continue
        answer = got.get((acl.resource, name))
        if answer is None:
            continue  # a topic that does not exist (yet): the caller's rules apply
        if isinstance(answer, Exception) or (answer and acl.operation not in answer):
            missing.append(acl)
    return missing
