"""``doctor``'s checks of a Kafka cluster: its brokers and what each serves (``ApiVersions``),
and the principal's ACLs against ``connectors.kafka.access.ROLES``."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from connectors.core.errors import ConnectorError
from connectors.doctor.checks import FAIL, OK, SKIP, WARN, Check

#: API keys of Kafka requests the version markers use (besides the wire path's own).
FETCH, API_VERSIONS_KEY, DESCRIBE_CLUSTER = 1, 18, 60


def versions_of(ranges: Mapping[int, tuple[int, int]]) -> str:
    """The Kafka versions a broker's request versions imply (a range: Kafka sends no
    version of its own). Markers: DescribeCluster (key 60, KIP-700, 2.8) and its v2 (4.0);
    Fetch without v0-v3 (KIP-896, 4.0; a 4.x broker still lists Produce from v0, for old
    librdkafka clients); AddPartitionsToTxn v4 (KIP-890, 3.6); ApiVersions v3 (KIP-511,
    2.4); Produce v7 (2.1)."""
    from connectors.kafka.wire.protocol import ADD_PARTITIONS, PRODUCE

    def top(api: int) -> int:
        return ranges.get(api, (0, -1))[1]

    if ranges.get(FETCH, (0, 0))[0] >= 4 or top(DESCRIBE_CLUSTER) >= 2:
        return "Kafka 4.0 or later"
    if top(ADD_PARTITIONS) >= 4:
        return "Kafka 3.6 to 3.9"
    if DESCRIBE_CLUSTER in ranges:
        return "Kafka 2.8 to 3.5"
    if top(API_VERSIONS_KEY) >= 3:
        return "Kafka 2.4 to 2.7"
    if top(PRODUCE) >= 7:
        return "Kafka 2.1 to 2.3"
    return "Kafka older than 2.1"


def broker_check(node: int, host: str, port: int, conf: Mapping[str, Any],
                 timeout: float) -> Check:
    """One broker's ``ApiVersions`` (sent before any login, as Kafka allows), and what it
    serves of what the sink needs."""
    from connectors.kafka.wire import requests
    from connectors.kafka.wire.producer import VERIFYING_ADD_PARTITIONS
    from connectors.kafka.wire.protocol import (
        ADD_PARTITIONS,
        API_NAMES,
        API_VERSIONS,
        INIT_PRODUCER_ID,
        VERSIONS,
        Connection,
    )
    from connectors.kafka.wire.settings import Settings

    name = f"broker {node} ({host}:{port})"
    settings = dataclasses.replace(Settings.of({**conf, "bootstrap.servers": f"{host}:{port}"}),
                                   login=None, connect_timeout=timeout,
                                   socket_timeout=timeout)
    try:
        conn = Connection(host, port, settings)
        try:
            error, ranges = requests.read_api_versions_v0(conn.call(
                API_VERSIONS, requests.api_versions_v0(), timeout, version=0))
        finally:
            conn.close()
    except (OSError, ConnectorError) as e:
        return Check("kafka", name, FAIL, f"no ApiVersions answer ({e})",
                     "is the advertised address reachable from here (advertised.listeners), "
                     "with the same TLS settings as the bootstrap servers?")
    if error:
        return Check("kafka", name, FAIL, f"ApiVersions answered error {error}",
                     "check the broker's log")
    kafka = versions_of(ranges)
    if INIT_PRODUCER_ID not in ranges:
        return Check("kafka", name, FAIL, f"{kafka}: no InitProducerId, so no idempotent or "
                     "transactional producer", "the Kafka sink needs Kafka 0.11 or later; "
                     "upgrade the cluster")
    verifies = ranges[ADD_PARTITIONS][1] >= VERIFYING_ADD_PARTITIONS
    missing = [f"{API_NAMES[a]} v{v}" for a, v in VERSIONS.items()
               if not ranges.get(a, (1, 0))[0] <= v <= ranges.get(a, (1, 0))[1]]
    found = (f"{kafka} (from ApiVersions): idempotent and transactional producer served; "
             + ("verifies a transaction's partitions (AddPartitionsToTxn "
                f"v{ranges[ADD_PARTITIONS][1]}, KIP-890)" if verifies else
                "does not verify a transaction's partitions (AddPartitionsToTxn "
                f"v{ranges[ADD_PARTITIONS][1]} < v4, KIP-890)"))
    if missing:
        return Check("kafka", name, WARN, f"{found}; the wire path's requests are not all "
                     f"served ({', '.join(missing)}): wireProduce=true goes through librdkafka",
                     "nothing to do: the Kafka sink (wireProduce=true, the default) uses "
                     "librdkafka on this broker by itself; Kafka 2.1 or later serves the "
                     "wire path")
    if not verifies:
        return Check("kafka", name, WARN, f"{found}; wire path requests served",
                     "transactional=true with wireProduce=true goes through librdkafka on "
                     "this broker (the wire path's transactions need Kafka 3.6+); the "
                     "recovery-key mode and wireProduce=false are unaffected")
    return Check("kafka", name, OK, f"{found}; the wire path's requests served")


def cluster_checks(conf: Mapping[str, Any], timeout: float) -> tuple[list[Check], Any]:
    """The cluster's brokers and each one's versions; also the process's cluster object that
    asked (:class:`connectors.kafka.clients.KafkaCluster`, leased: the caller releases it;
    None: no answer). The first request is the connectors' own (its ``first_contact``): a
    failed login or a protocol mismatch is named within seconds, silence at ``timeout``."""
    from connectors.kafka import clients

    bootstrap = str(conf.get("bootstrap.servers"))
    held = clients.acquire(conf)
    try:
        # Metadata of every topic: a request that names none creates none.
        meta = held.client.first_contact(who="doctor", timeout=timeout, error=ConnectorError)
    except ConnectorError as e:
        held.release()
        said = str(e).replace(f"connectTimeout={timeout:g}s", f"--timeout {timeout:g}s")
        return [Check("kafka", "cluster", FAIL, said)], None
    brokers = sorted(meta.brokers.values(), key=lambda b: b.id)
    checks = [Check("kafka", "cluster", OK,
                    f"{bootstrap}: {len(brokers)} broker(s) {[b.id for b in brokers]}, "
                    f"controller {meta.controller_id}, cluster id {meta.cluster_id}")]
    checks += [broker_check(b.id, b.host, b.port, conf, timeout) for b in brokers]
    return checks, held


# -- ACLs ------------------------------------------------------------------------------------
def acl_checks(kafka: Any, conf: Mapping[str, Any], names: Mapping[str, str],
               timeout: float, only: Sequence[str] = ()) -> list[Check]:
    """Each role of ``ROLES`` (those in ``only``, if given) whose names are all given: every
    ACL held or missing, from one Describe (with the principal's authorized operations) of
    each topic and group; ``kafka`` the process's cluster object of ``conf``
    (:class:`connectors.kafka.clients.KafkaCluster`: the wire client's Metadata v8 and
    DescribeGroups v3, as the connectors' own preflight asks, else librdkafka's admin
    client). A Describe never creates a topic; the metadata listing cannot stand in for it,
    as it leaves out the topics the principal may not describe."""
    from connectors.kafka import access

    roles = {role: [a.bind(**names) for a in acls] for role, acls in access.ROLES.items()
             if all(_fields(a) <= set(names) for a in acls) and (not only or role in only)}
    if not roles:
        needs = []
        for role, acls in access.ROLES.items():
            if only and role not in only:
                continue
            flags = sorted({_FLAGS[f] for a in acls for f in _fields(a) - set(names)})
            needs.append(f"{role}: {' '.join(flags)}")
        return [Check("acl", "ACLs", SKIP, "no role of docs/security.md has all its names",
                      f"give what a role needs ({'; '.join(needs)})")]
    principal = access.principal_of(conf) or "this client's principal"
    topics = sorted({_concrete(a) for acls in roles.values() for a in acls
                     if a.resource == "TOPIC"})
    groups = sorted({_concrete(a) for acls in roles.values() for a in acls
                     if a.resource == "GROUP"})
    held = _described(kafka, topics, groups, timeout)
    checks = []
    for role, bound in roles.items():
        have: list[str] = []
        missing: list[str] = []
        unknown: list[str] = []
        for a in bound:
            if a.resource not in ("TOPIC", "GROUP"):
                unknown.append(f"{a.describe()} (Kafka reports no operations on a "
                               f"{a.resource.lower().replace('_', ' ')}: not checked)")
                continue
            ops = held[(a.resource, _concrete(a))]
            if isinstance(ops, str):
                (missing if ops.startswith("denied") else unknown).append(
                    f"{a.describe()}: {ops}")
            elif not ops:
                unknown.append(f"{a.describe()}: the broker reported no operations (KIP-430, "
                               "Kafka 2.3+)")
            elif a.operation in ops:
                have.append(a.describe())
            else:
                missing.append(a.describe())
        title = access.ROLE_TITLES.get(role, role)
        found = "; ".join(filter(None, [
            f"held: {', '.join(have)}" if have else "",
            f"MISSING: {', '.join(missing)}" if missing else "",
            f"unknown: {', '.join(unknown)}" if unknown else ""]))
        grants = [a.grant_command(access.principal_of(conf) or "User:<name>") for a in bound
                  if any(m.startswith(a.describe()) for m in missing)]
        status = FAIL if missing else (SKIP if unknown and not have else OK)
        checks.append(Check("acl", f"ACLs of {title} for {principal}", status, found,
                            "; ".join(grants)))
    return checks


#: The doctor's flag that names each field of an ACL's name template.
_FLAGS = {"topic": "--topic", "group": "--group", "sink_id": "--sink-id",
          "facts_topic": "--sink-id"}


def _fields(acl: Any) -> set[str]:
    return set(re.findall(r"{(\w+)}", acl.name))


def _concrete(acl: Any) -> str:
    """A name a prefixed ACL covers (the first writer's group), as the preflight asks."""
    return acl.name + "0" if acl.pattern == "PREFIXED" else acl.name


def _described(kafka: Any, topics: list[str], groups: list[str],
               timeout: float) -> dict[tuple[str, str], set[str] | str]:
    """The operations the principal holds on each topic and group, or why none."""
    from connectors.kafka.wire import admin
    from connectors.kafka.wire.protocol import ERRORS, WireError

    held: dict[tuple[str, str], set[str] | str] = {}
    wire = kafka.lookups()
    if wire is None:  # a login the wire client does not speak: librdkafka's admin client
        from confluent_kafka import TopicCollection

        client = kafka.admin()
        if topics:
            futures = client.describe_topics(TopicCollection(topics), request_timeout=timeout,
                                             include_authorized_operations=True)
            held.update((("TOPIC", t), _ops(f, timeout)) for t, f in futures.items())
        if groups:
            futures = client.describe_consumer_groups(groups, request_timeout=timeout,
                                                      include_authorized_operations=True)
            held.update((("GROUP", g), _ops(f, timeout)) for g, f in futures.items())
        return held

    def verdict(code: int, bits: int | None) -> set[str] | str:
        if code in (29, 30):  # TOPIC_ or GROUP_AUTHORIZATION_FAILED
            return "denied (not even DESCRIBE)"
        if code == 3:
            return "does not exist here (nothing was created)"
        if code:
            return f"no answer ({ERRORS.get(code, code)})"
        return admin.operations(bits)

    try:
        if topics:
            for t, meta in admin.describe_topics(wire, topics, timeout, "doctor").items():
                held[("TOPIC", t)] = verdict(meta.error, meta.authorized)
        if groups:
            for g, group in admin.describe_groups(wire, groups, timeout, "doctor").items():
                held[("GROUP", g)] = verdict(group.error if group.error != 69 else 0,
                                             group.authorized)
    except WireError as e:
        for key in [("TOPIC", t) for t in topics] + [("GROUP", g) for g in groups]:
            held.setdefault(key, f"no answer ({e})")
    return held


def _ops(future: Any, timeout: float) -> set[str] | str:
    """The operations the principal holds on one described resource, or why none."""
    from connectors.kafka import access

    try:
        answer = future.result(timeout)
    except Exception as e:  # noqa: BLE001 - a KafkaException, or the future's timeout
        if access.is_access_error(e):
            return "denied (not even DESCRIBE)"
        if access._error_name(e) == "UNKNOWN_TOPIC_OR_PART":
            return "does not exist here (nothing was created)"
        return f"no answer ({e})"
    return {op.name for op in (answer.authorized_operations or [])}
