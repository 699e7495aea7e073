"""``eo-connectors doctor`` against real services (issue 36, item 8): what each broker serves,
read from its ``ApiVersions`` (Apache Kafka 3.5.2, 3.9.1, 4.4.0 and the session's broker);
read-only (a topic it is asked about and that does not exist stays absent); the principal's
ACLs on the secured broker, held and missing; the storage probe on a real S3 server, on one
that ignores conditional writes, and on one whose credentials are missing."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from connectors import cli
from connectors.core.storage import forget_probes
from connectors.demo.services.kafka import ApacheKafka, create_topic
from connectors.kafka.access import ROLES
from tests.integration import test_kafka_secured as secured_tier
from tests.integration.test_kafka_secured import _grant, _role_acls, _user

#: The secured broker of test_kafka_secured.py (SASL_SSL, SCRAM, ACLs enforced), one per module.
secured = secured_tier.secured


def doctor(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = cli.main(["doctor", "--json", "--timeout", "20", *argv])
    out, err = capsys.readouterr()
    assert out.strip(), err
    return code, json.loads(out)


def checks_in(doc: dict[str, Any], area: str) -> list[dict[str, Any]]:
    return [c for c in doc["checks"] if c["area"] == area]


def _topics(bootstrap: str) -> set[str]:
    from confluent_kafka.admin import AdminClient

    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics)


# -- the cluster -----------------------------------------------------------------------------------
def test_doctor_names_what_the_session_broker_serves_and_creates_nothing(
        kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]) -> None:
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    before = _topics(kafka_bootstrap)
    code, doc = doctor(capsys, "--bootstrap", kafka_bootstrap, "--topic", missing,
                       "--group", group, "--sink-id", "s1")
    kafka = checks_in(doc, "kafka")
    assert kafka[0]["name"] == "cluster" and kafka[0]["status"] == "ok", kafka
    brokers = kafka[1:]
    assert brokers and all(b["status"] == "ok" for b in brokers), brokers
    for b in brokers:
        assert "verifies a transaction's partitions" in b["found"], b
        assert "idempotent and transactional producer served" in b["found"]
    acls = checks_in(doc, "acl")
    assert acls and all(c["status"] != "FAIL" for c in acls), acls  # no authorizer here
    assert any(f"Topic {missing!r}: does not exist here (nothing was created)" in c["found"]
               for c in acls), acls
    assert code == (0 if doc["ok"] else 1)
    # A topic made after the command is listed: one the command set off would be too.
    later = f"later-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, later, 1)
    after = _topics(kafka_bootstrap)
    assert later in after and missing not in after
    assert after - before - {later} <= {"__consumer_offsets"}, after - before


def test_an_unreachable_cluster_is_one_failed_line(capsys: pytest.CaptureFixture[str]) -> None:
    from connectors.demo.services.kafka import free_port

    code, doc = doctor(capsys, "--bootstrap", f"127.0.0.1:{free_port()}", "--timeout", "3")
    (cluster,) = checks_in(doc, "kafka")
    assert code == 1 and cluster["status"] == "FAIL", cluster
    assert "cannot reach Kafka" in cluster["found"] and "--timeout 3s" in cluster["found"]


#: Each version's expected reading: the range it implies, and whether it verifies a
#: transaction's partitions (KIP-890, the wire path's transactions).
VERSIONS = {"3.5.2": ("Kafka 2.8 to 3.5", False), "3.9.1": ("Kafka 3.6 to 3.9", True),
            "4.4.0": ("Kafka 4.0 or later", True)}


@pytest.fixture(scope="module", params=sorted(VERSIONS))
def versioned(request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    broker = ApacheKafka(workdir=str(tmp_path_factory.mktemp(f"kafka-{request.param}")),
                         version=request.param).start()
    try:
        yield request.param, broker
    finally:
        broker.stop()


def test_doctor_reads_each_broker_version_from_its_api_versions(
        versioned: tuple[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    version, broker = versioned
    implied, verifies = VERSIONS[version]
    code, doc = doctor(capsys, "--bootstrap", broker.bootstrap)
    (cluster, node) = checks_in(doc, "kafka")
    assert implied in node["found"], node
    if verifies:
        assert node["status"] == "ok", node
    else:
        assert node["status"] == "warn" and "does not verify" in node["found"], node
        assert "transactional=true with wireProduce=true goes through librdkafka" in node["todo"]
    assert code == 0, doc  # an older broker limits the wire path; it fails nothing


# -- ACLs on the secured broker ----------------------------------------------------------------
def _config(secured: Any, user: str, tmp_path: Any, **override: Any) -> str:
    path = tmp_path / f"{user}.properties"
    path.write_text("".join(f"{k}={v}\n" for k, v in secured.client_conf(user, **override).items()
                            if k != "bootstrap.servers"))
    return str(path)


def _topic(secured: Any) -> str:
    name = f"d-{uuid.uuid4().hex[:8]}"
    create_topic(secured.setup_bootstrap, name, 2)
    return name


@pytest.mark.parametrize("dropped", [None, *range(len(ROLES["lag"]))])
def test_doctor_names_the_acls_a_principal_holds_and_lacks(
        secured: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str],
        dropped: int | None) -> None:
    topic, group = _topic(secured), f"g-{uuid.uuid4().hex[:8]}"
    user = _user(secured, "doctor")
    acls = _role_acls("lag", topic=topic, group=group)
    _grant(secured, user, [a for i, a in enumerate(acls) if i != dropped])
    code, doc = doctor(capsys, "--bootstrap", secured.bootstrap, "--kafka-config",
                       _config(secured, user, tmp_path), "--topic", topic, "--group", group,
                       "--role", "lag")
    kafka = checks_in(doc, "kafka")
    assert all(c["status"] == "ok" for c in kafka), kafka  # ApiVersions over TLS, no login
    (lag,) = checks_in(doc, "acl")
    assert f"User:{user}" in lag["name"]
    if dropped is None:
        assert lag["status"] == "ok" and code == 0, lag
        assert all(a.describe() in lag["found"] for a in acls), lag
        return
    missing = acls[dropped]
    assert code == 1 and lag["status"] == "FAIL", lag
    assert f"MISSING: {missing.describe()}" in lag["found"], lag
    assert missing.grant_command(f"User:{user}") in lag["todo"]


def test_doctor_with_a_wrong_password_says_so_without_it(
        secured: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    user = _user(secured, "doctor")
    config = _config(secured, user, tmp_path, password="not-the-password")
    code, doc = doctor(capsys, "--bootstrap", secured.bootstrap, "--kafka-config", config,
                       "--timeout", "10")
    (cluster,) = checks_in(doc, "kafka")
    assert code == 1 and cluster["status"] == "FAIL", cluster
    assert "authentication failed" in cluster["found"], cluster
    assert "not-the-password" not in json.dumps(doc)


# -- storage ---------------------------------------------------------------------------------------
def test_doctor_probes_a_real_s3_bucket_and_leaves_nothing(
        s3_service: Any, s3_bucket: str, capsys: pytest.CaptureFixture[str]) -> None:
    from connectors.core.storage import storage_for, storage_options_from

    forget_probes()
    url = f"s3://{s3_bucket}/wal"
    options = [f"--storage={k}={v}" for k, v in s3_service.python_options().items()]
    code, doc = doctor(capsys, "--path", url, *options)
    (check,) = checks_in(doc, "storage")
    assert check["status"] == "ok" and "conditional PUT" in check["found"], check
    assert code == 0 or any(c["status"] == "FAIL" for c in checks_in(doc, "install"))
    storage, root = storage_for(url, options=storage_options_from(s3_service.python_options(),
                                                                  "t"))
    assert list(storage.walk_files(root)) == []
    forget_probes()


def test_doctor_refuses_a_store_that_ignores_conditional_writes(
        no_conditional_s3: Any, capsys: pytest.CaptureFixture[str]) -> None:
    forget_probes()
    options = [f"--storage={k}={v}" for k, v in no_conditional_s3.python_options().items()]
    code, doc = doctor(capsys, "--path", f"s3://{no_conditional_s3.bucket}/wal", *options)
    (check,) = checks_in(doc, "storage")
    assert code == 1 and check["status"] == "FAIL", check
    assert "does not enforce create-if-absent" in check["found"]
    forget_probes()
