"""Kafka ACLs: what each role needs, and the one error a missing ACL or a failed login gives.

:data:`ROLES` declares, once, the ACLs each component needs (resource type, name or prefix,
pattern type, operation, why). docs/security.md's tables are generated from it
(``tests/unit/test_security_doc.py`` checks they match) and the secured integration tests
grant exactly these and remove each in turn.

:func:`denied` turns an authorization or authentication error from librdkafka into one
:class:`~connectors.core.errors.ConnectorError` that names the principal (the configured
``sasl.username``), the resource, the operation and the ACL to grant. Such errors are never
transient (:func:`is_access_error`; ``kafka/common.is_transient`` asks it): retrying cannot
grant an ACL or fix a password. No secret is ever part of the message.

This module imports nothing else of ``connectors.kafka`` (``common`` imports it);
:mod:`connectors.kafka.preflight` asks a cluster about the ACLs declared here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: librdkafka error names of a denied request, and the resource type each is about.
AUTHORIZATION = {
    "TOPIC_AUTHORIZATION_FAILED": "TOPIC",
    "GROUP_AUTHORIZATION_FAILED": "GROUP",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": "TRANSACTIONAL_ID",
    "CLUSTER_AUTHORIZATION_FAILED": "CLUSTER",
    "DELEGATION_TOKEN_AUTHORIZATION_FAILED": "DELEGATION_TOKEN",
}
#: librdkafka error names of a failed login or TLS handshake.
AUTHENTICATION = (
    "SASL_AUTHENTICATION_FAILED",
    "_AUTHENTICATION",
    "_SSL",
    "UNSUPPORTED_SASL_MECHANISM",
    "ILLEGAL_SASL_STATE",
    "SECURITY_DISABLED",
)

#: Resource types as Kafka's tools and docs spell them.
_TYPE_NAMES = {"TOPIC": "Topic", "GROUP": "Group", "TRANSACTIONAL_ID": "TransactionalId",
               "CLUSTER": "Cluster", "DELEGATION_TOKEN": "DelegationToken"}
_TOOL_FLAGS = {"TOPIC": "--topic", "GROUP": "--group", "TRANSACTIONAL_ID": "--transactional-id",
               "CLUSTER": "--cluster"}


@dataclass(frozen=True)
class Acl:
    """One ALLOW ACL a role needs. ``name`` is a template over the role's settings
    (``{topic}``, ``{group}``, ``{sink_id}``, ``{facts_topic}``); ``pattern`` is ``LITERAL``
    or ``PREFIXED``."""

    resource: str
    name: str
    pattern: str
    operation: str
    why: str

    def bind(self, **names: str) -> Acl:
        return Acl(self.resource, self.name.format(**names), self.pattern, self.operation,
                   self.why)

    def key(self) -> tuple[str, str, str, str]:
        return (self.resource, self.name, self.pattern, self.operation)

    def describe(self) -> str:
        kind = _TYPE_NAMES.get(self.resource, self.resource)
        if self.resource == "CLUSTER":
            return f"{self.operation} on the Cluster"
        where = "prefix" if self.pattern == "PREFIXED" else ""
        return f"{self.operation} on {kind} {where + ' ' if where else ''}{self.name!r}"

    def grant_command(self, principal: str) -> str:
        """The ``kafka-acls.sh`` arguments that grant it."""
        flag = _TOOL_FLAGS.get(self.resource, f"--{self.resource.lower()}")
        target = flag if self.resource == "CLUSTER" else f"{flag} '{self.name}'"
        pattern = " --resource-pattern-type prefixed" if self.pattern == "PREFIXED" else ""
        op = self.operation.replace("_", "").title() if self.operation == "IDEMPOTENT_WRITE" \
            else self.operation.title()
        return (f"kafka-acls.sh --add --allow-principal {principal} --operation {op} "
                f"{target}{pattern}")


def _acl(resource: str, name: str, pattern: str, operation: str, why: str) -> Acl:
    return Acl(resource, name, pattern, operation, why)


_SOURCE = (
    _acl("TOPIC", "{topic}", "LITERAL", "READ",
         "Metadata, ListOffsets and Fetch of the subscribed topics (READ includes DESCRIBE); "
         "OffsetCommit of the group's offsets"),
    _acl("GROUP", "{group}", "LITERAL", "READ",
         "OffsetCommit of each batch's end to `kafka.group.id` (READ includes the DESCRIBE "
         "that OffsetFetch needs for `startingOffsets=group`)"),
)

#: Role -> the ACLs it needs; a role's settings fill the names in.
ROLES: dict[str, tuple[Acl, ...]] = {
    "source": _SOURCE,
    "source-group": _SOURCE,
    "windows": _SOURCE,
    "sink": (
        _acl("TOPIC", "{topic}", "LITERAL", "WRITE",
             "Produce, with the idempotent producer (WRITE on a topic lets it get a producer "
             "id since Kafka 3.0); Metadata and ListOffsets of the target (WRITE includes "
             "DESCRIBE)"),
        _acl("TOPIC", "{topic}", "LITERAL", "READ",
             "a retried task's recovery scan reads the target topic"),
    ),
    "transactional-sink": (
        _acl("TOPIC", "{topic}", "LITERAL", "WRITE",
             "Produce and AddPartitionsToTxn of the rows; Metadata of the target (WRITE "
             "includes DESCRIBE)"),
        _acl("TRANSACTIONAL_ID", "{sink_id}-", "PREFIXED", "WRITE",
             "InitProducerId (fencing), AddPartitionsToTxn, AddOffsetsToTxn and EndTxn of "
             "the transactional ids `<sink_id>-<writer>` (WRITE includes the DESCRIBE of "
             "FindCoordinator)"),
        _acl("GROUP", "eo-sink-{sink_id}-w", "PREFIXED", "READ",
             "TxnOffsetCommit of each writer's commit fact to group "
             "`eo-sink-<sink_id>-w<writer>`, and the retry's OffsetFetch of it (READ "
             "includes DESCRIBE)"),
        _acl("TOPIC", "{facts_topic}", "LITERAL", "READ",
             "the commit fact is an offset on partition 0 of the facts topic: TxnOffsetCommit "
             "needs READ on it, OffsetFetch DESCRIBE (included)"),
        _acl("TOPIC", "{facts_topic}", "LITERAL", "CREATE",
             "only while the facts topic does not exist: the driver creates it (one "
             "partition). Create it yourself and this ACL is not needed"),
    ),
    "transactions": (
        _acl("TOPIC", "{topic}", "LITERAL", "READ",
             "Metadata and ListOffsets (both isolation levels) of the sink's topic, and Fetch "
             "of the first record past a held partition's last stable offset, for its age "
             "(READ includes DESCRIBE)"),
        _acl("TRANSACTIONAL_ID", "{sink_id}-", "PREFIXED", "WRITE",
             "`--abort`: InitProducerId with each transactional id `<sink_id>-<writer>`, "
             "which aborts its open transaction (the sink's own ACL)"),
    ),
    "lag": (
        _acl("GROUP", "{group}", "LITERAL", "DESCRIBE", "OffsetFetch of the group's offsets"),
        _acl("TOPIC", "{topic}", "LITERAL", "DESCRIBE",
             "ListOffsets of the group's partitions (their ends)"),
    ),
}


def principal_of(conf: Mapping[str, Any]) -> str | None:
    """``User:<sasl.username>`` when the client logs in with one, else None (the broker maps
    a TLS certificate or an OAUTHBEARER token to its principal itself)."""
    user = conf.get("sasl.username") or conf.get("kafka.sasl.username")
    return f"User:{user}" if user else None


def kafka_error(exc: BaseException) -> Any | None:
    """The ``confluent_kafka.KafkaError`` inside ``exc`` (or ``exc`` itself), else None."""
    from confluent_kafka import KafkaError, KafkaException

    if isinstance(exc, KafkaError):
        return exc
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return exc.args[0]
    return None


def _error_name(exc: BaseException | Any) -> str | None:
    err = exc if hasattr(exc, "name") and hasattr(exc, "code") else kafka_error(exc)
    if err is None:
        return None
    try:
        name = err.name  # KafkaError.name(); the wire client's WireError.name
        return str(name() if callable(name) else name)
    except Exception:  # noqa: BLE001 - a KafkaError without a name
        return None


def is_access_error(exc: BaseException | Any) -> bool:
    """True for an authorization or authentication failure (never worth a retry)."""
    name = _error_name(exc)
    if name in AUTHORIZATION or name in AUTHENTICATION:
        return True
    text = str(exc)
    return any(n in text for n in (*AUTHORIZATION, "SASL_AUTHENTICATION_FAILED",
                                   "Authentication failed", "SSL handshake failed"))


def denied(exc: BaseException | Any, *, who: str, conf: Mapping[str, Any],
           needs: Sequence[Acl], request: str) -> str | None:
    """The message for ``exc`` if it is an access error, else None.

    ``needs`` are the ACLs the failed ``request`` depends on (names filled in); the one whose
    resource type the error names is the one reported (all of them when the error does not
    say, as with an authentication failure)."""
    if not is_access_error(exc):
        return None
    name = _error_name(exc)
    text = str(exc)
    if name not in AUTHORIZATION and name not in AUTHENTICATION:
        name = next((n for n in (*AUTHORIZATION, *AUTHENTICATION) if n in text), name)
    principal = principal_of(conf)
    who_is = principal or "this client's principal"
    if name in AUTHORIZATION or (name is None and "AUTHORIZATION" in text):
        kind = AUTHORIZATION.get(name or "", "")
        matching = [a for a in needs if a.resource == kind] or list(needs)
        if not matching:
            return (f"{who}: {request}: {who_is} is not authorized ({name}); see "
                    "docs/security.md for the ACLs each role needs")
        missing = "; ".join(a.describe() for a in matching)
        grants = "; ".join(a.grant_command(principal or "User:<name>") for a in matching)
        return (f"{who}: {request}: {who_is} has no {missing} ({name}); grant it: {grants} "
                "(docs/security.md lists every ACL this role needs)")
    # Authentication or TLS: say which setting to look at, never its value.
    servers = conf.get("bootstrap.servers", "?")
    if name == "_SSL" or "SSL handshake" in text:
        what, check = "the TLS handshake", ("kafka.ssl.ca.location (the CA that signed the "
                                            "brokers' certificates) and the host names in "
                                            "bootstrap.servers")
    elif "mechanism handshake" in text or "UNSUPPORTED_SASL_MECHANISM" in text:
        what, check = ("the SASL mechanism",
                       "kafka.sasl.mechanism (the broker names the ones it enables)")
    else:
        what, check = "authentication", "kafka.sasl.username and kafka.sasl.password"
    return (f"{who}: {request}: {what} with {servers} failed for {who_is} "
            f"({_first_line(text)}); check {check} (docs/security.md)")


def _first_line(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else "no detail"
    return line[:300]


#: The librdkafka error code of a denied request on each resource type.
AUTHORIZATION_CODE = {"TOPIC": 29, "GROUP": 30, "CLUSTER": 31, "TRANSACTIONAL_ID": 53}


#: What each role is, for docs/security.md.
ROLE_TITLES = {
    "source": "`eo_kafka` source, streaming (`readStream`)",
    "source-group": "`eo_kafka` source with `startingOffsets=group`",
    "windows": "`KafkaWindows` (batch windows)",
    "sink": "`eo_kafka` sink, recovery-key mode (the default)",
    "transactional-sink": "`eo_kafka` sink, `transactional=true`",
    "transactions": "`python -m connectors transactions`",
    "lag": "`python -m connectors lag`",
}


def docs_table(role: str) -> str:
    """The Markdown table of ``role``'s ACLs in docs/security.md (generated; a unit test
    checks the page holds exactly this)."""
    rows = ["| resource type | name | pattern type | operation | why |",
            "|---|---|---|---|---|"]
    for a in ROLES[role]:
        name = "(the cluster)" if a.resource == "CLUSTER" else f"`{a.name}`"
        rows.append(f"| {_TYPE_NAMES.get(a.resource, a.resource)} | {name} | {a.pattern} | "
                    f"{a.operation} | {a.why} |")
    return "\n".join(rows)

