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

from connectors.core.errors import ConnectorError
from connectors.kafka import access
from connectors.kafka.common import is_transient, retrying

log = logging.getLogger(__name__)

#: Bootstrap lists of clusters whose every Describe granted every operation: no authorizer
#: (Kafka then reports all operations as authorized) or a super user. No ACL can be missing
#: there, so the preflight asks nothing more in this process.
_ALL_ALLOWED: set[str] = set()
#: The operations Kafka reports for a topic or group when nothing is denied.
_ALL_OPERATIONS = {
    "TOPIC": {"READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "DESCRIBE_CONFIGS",
              "ALTER_CONFIGS"},
    "GROUP": {"READ", "DESCRIBE", "DELETE"},
}
#: The longest one Describe of the preflight may take before it is asked again.
PREFLIGHT_REQUEST_TIMEOUT = 10.0


def preflight(admin: Any, conf: Mapping[str, Any], checks: Sequence[tuple[access.Acl, str]], *,
              who: str, timeout: float, error: type[Exception],
              retry_timeout: float | None = None) -> None:
    """Fail before anything is read or written when the principal lacks an ACL of
    ``checks``: ``(acl, concrete name)`` pairs (a prefixed ACL is checked on one name it
    covers). Topics and groups report the principal's authorized operations (KIP-430) in
    one Describe request each; a topic that does not exist is left to the caller. ACLs on
    transactional ids and the cluster cannot be asked about this way: their first request
    (InitProducerId) fails with the same message instead.

    The check must never be what stops a query: a cluster without an authorizer (every
    operation granted on everything described) is not asked again in this process; a
    Describe that times out or
    meets a node restarting is asked again, each try bounded by
    :data:`PREFLIGHT_REQUEST_TIMEOUT`, until ``retry_timeout`` (``metadataRetryTimeout``);
    if the answer is still unknown then, the check is skipped with a warning (a missing ACL
    still fails the first request that needs it, naming it). Only an answer that says
    "denied" fails here."""
    from confluent_kafka import KafkaException, TopicCollection

    topics = sorted({n for a, n in checks if a.resource == "TOPIC"})
    groups = sorted({n for a, n in checks if a.resource == "GROUP"})
    if not topics and not groups:
        return
    servers = str(conf.get("bootstrap.servers", ""))
    if servers in _ALL_ALLOWED:
        return
    request_timeout = max(1.0, min(timeout, PREFLIGHT_REQUEST_TIMEOUT))

    def describe() -> dict[tuple[str, str], Any]:
        out: dict[tuple[str, str], Any] = {}
        if topics:
            futs = admin.describe_topics(TopicCollection(topics),
                                         request_timeout=request_timeout,
                                         include_authorized_operations=True)
            for t, f in futs.items():
                try:
                    out[("TOPIC", t)] = f.result()
                except KafkaException as e:
                    if access._error_name(e) == "UNKNOWN_TOPIC_OR_PART":
                        out[("TOPIC", t)] = None
                    elif access._error_name(e) in access.AUTHORIZATION:
                        out[("TOPIC", t)] = e
                    else:
                        raise
        if groups:
            futs = admin.describe_consumer_groups(groups, request_timeout=request_timeout,
                                                  include_authorized_operations=True)
            for g, f in futs.items():
                try:
                    out[("GROUP", g)] = f.result()
                except KafkaException as e:
                    if access._error_name(e) not in access.AUTHORIZATION:
                        raise
                    out[("GROUP", g)] = e
        return out

    what = f"{who}: describing {topics + groups} for the principal's ACLs"
    try:
        got = retrying(describe, what=what, error=_Unknown,
                       timeout=retry_timeout if retry_timeout is not None else timeout)
    except _Unknown as e:
        cause = e.__cause__
        if cause is None or not is_transient(cause):
            raise error(str(e)) from cause
        log.warning("%s: the ACL check is skipped, its answer is unknown (%s); a missing ACL "
                    "fails the first request that needs it, naming it", who, cause)
        return
    if got and all(answer is not None and not isinstance(answer, Exception)
                   and _ALL_OPERATIONS[kind] <= {op.name for op in
                                                 (answer.authorized_operations or [])}
                   for (kind, _), answer in got.items()):
        _ALL_ALLOWED.add(servers)
        return
    missing: list[access.Acl] = []
    for acl, name in checks:
        if acl.resource not in ("TOPIC", "GROUP"):
            continue
        answer = got.get((acl.resource, name))
        if answer is None:
            continue  # a topic that does not exist (yet): the caller's rules apply
        if isinstance(answer, Exception):
            missing.append(acl)
            continue
        ops = {op.name for op in (answer.authorized_operations or [])}
        if ops and acl.operation not in ops:
            missing.append(acl)
    if missing:
        from confluent_kafka import KafkaError

        kind = access.AUTHORIZATION_CODE[missing[0].resource]
        message = access.denied(KafkaException(KafkaError(kind)), who=who, conf=conf,
                         needs=[a for a in missing if a.resource == missing[0].resource],
                         request="checking ACLs before the first read or write")
        raise error(message)


class _Unknown(ConnectorError):
    """The preflight's Describe gave no answer within its deadline (internal)."""
