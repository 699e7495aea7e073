"""``eo-connectors doctor`` (connectors/doctor/) without services (issue 36, item 8): this
install's lines with and without the C extensions, Java and Maven; the versions a broker's
``ApiVersions`` imply; the ACL lines from a principal's authorized operations; the storage
probe on a local path. The cluster and object-store lines against real services:
tests/integration/test_cli_doctor.py.
"""

from __future__ import annotations

import ast
import json
import sys
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from connectors import cli, doctor
from connectors.doctor import cluster, install
from connectors.kafka.access import ROLES
from connectors.kafka.sink.commit_facts import DEFAULT_FACTS_TOPIC
from connectors.kafka.sink.options import KAFKA_SINK_OPTIONS
from connectors.kafka.wire import record_batch

REPO = Path(__file__).resolve().parents[2]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any], str]:
    code = cli.main(["doctor", "--json", *argv])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else {}, err


def by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in doc["checks"]}


def built() -> bool:
    return all(install._extension(m) is None for m in install.EXTENSIONS)


WIRE_DEFAULT = next(o.default for o in KAFKA_SINK_OPTIONS if o.spark == "wireProduce")


def test_every_extension_setup_py_builds_is_checked() -> None:
    tree = ast.parse((REPO / "setup.py").read_text())
    built_by_setup = {n.args[0].value for n in ast.walk(tree) if isinstance(n, ast.Call)
                      and getattr(n.func, "id", "") == "Extension"
                      and isinstance(n.args[0], ast.Constant)}
    assert built_by_setup == set(install.EXTENSIONS), (
        "setup.py builds other extensions than connectors/doctor/install.py's EXTENSIONS checks")


@pytest.mark.c_extensions
@pytest.mark.skipif(not built(), reason="the C extensions are not built in this install")
def test_with_the_extensions_built(capsys: pytest.CaptureFixture[str]) -> None:
    code, doc, err = run(capsys)
    checks = by_name(doc)
    for module in install.EXTENSIONS:
        check = checks[f"C extension {module.rsplit('.', 1)[1]}"]
        assert check["status"] == "ok" and check["found"].startswith("built: "), check
    path = checks["Kafka sink produce path"]["found"]
    assert f"wireProduce={str(WIRE_DEFAULT).lower()}, the default" in path
    assert "record batches on the wire" in path
    for name in ("python", "pyspark", "confluent-kafka"):
        assert checks[name]["status"] == "ok", checks[name]
    assert "librdkafka" in checks["confluent-kafka"]["found"]
    assert code == (0 if doc["ok"] else 1) and doc["ok"] == all(
        c["status"] != "FAIL" for c in doc["checks"])


def test_without_the_extensions(capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    # As an install without a C compiler: neither module imports, the encoder is absent.
    for module in install.EXTENSIONS:
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setattr(record_batch, "_record_batch", None)
    code, doc, _ = run(capsys)
    checks = by_name(doc)
    for name in [f"C extension {m.rsplit('.', 1)[1]}" for m in install.EXTENSIONS]:
        assert checks[name]["status"] == "warn", checks[name]
        assert checks[name]["found"].startswith("not built")
        assert "C compiler" in checks[name]["todo"] and "reinstall" in checks[name]["todo"]
    assert "one by one" in checks["C extension _keyed_produce"]["found"]
    path = checks["Kafka sink produce path"]
    assert "because the _record_batch extension is not built" in path["found"]
    assert path["status"] == ("warn" if WIRE_DEFAULT else "ok")
    # a missing extension is slower, not broken: it fails nothing
    assert all(c["status"] != "FAIL" for c in doc["checks"] if c["area"] == "install"
               and c["name"] not in ("java", "maven")), doc


@pytest.mark.c_extensions
def test_a_wire_path_the_kafka_settings_rule_out_is_named(
        capsys: pytest.CaptureFixture[str]) -> None:
    if install._extension("connectors.kafka.wire._record_batch") is not None:
        pytest.skip("the _record_batch extension is not built")
    code, doc, _ = run(capsys, "--kafka", "compression.type=zstd")
    assert "compression.type=zstd" in by_name(doc)["Kafka sink produce path"]["found"]


def test_without_java_and_maven_the_local_services_are_named(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(install.shutil, "which", lambda tool: None)
    code, doc, _ = run(capsys)
    checks = by_name(doc)
    assert checks["java"]["status"] == "warn" and "Java 17" in checks["java"]["todo"]
    assert checks["maven"]["status"] == "warn" and "Maven" in checks["maven"]["todo"]
    assert "--bootstrap" in checks["java"]["found"]


def test_text_output_is_one_line_per_check_with_what_to_do(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "connectors.kafka.wire._record_batch", None)
    monkeypatch.setattr(record_batch, "_record_batch", None)
    cli.main(["doctor"])
    out = capsys.readouterr().out
    assert out.startswith("this install:\n")
    assert "  warn  C extension _record_batch: not built" in out
    assert "        -> install a C compiler" in out


@pytest.mark.parametrize(("ranges", "expected"), [
    # as Apache Kafka 4.1.2 and 4.4.0 list them: Fetch from v4, Produce still from v0
    ({0: (0, 13), 1: (4, 18), 24: (0, 5), 60: (0, 2), 18: (0, 4)}, "Kafka 4.0 or later"),
    ({0: (0, 11), 1: (0, 17), 24: (0, 5), 60: (0, 1), 18: (0, 4)}, "Kafka 3.6 to 3.9"),
    ({0: (0, 9), 1: (0, 15), 24: (0, 3), 60: (0, 0), 18: (0, 3)}, "Kafka 2.8 to 3.5"),
    ({0: (0, 8), 1: (0, 12), 24: (0, 1), 18: (0, 3)}, "Kafka 2.4 to 2.7"),
    ({0: (0, 7), 1: (0, 10), 24: (0, 1), 18: (0, 2)}, "Kafka 2.1 to 2.3"),
    ({0: (0, 5), 18: (0, 1)}, "Kafka older than 2.1"),
])
def test_the_kafka_versions_a_broker_s_request_versions_imply(
        ranges: dict[int, tuple[int, int]], expected: str) -> None:
    assert cluster.versions_of(ranges) == expected


# -- ACLs ----------------------------------------------------------------------------------------
class FakeAdmin:
    """Describe answers as Kafka gives them: the principal's authorized operations (KIP-430)
    per topic and group, or a denial. It stands in for the process's cluster object
    (``clients.KafkaCluster``) of a cluster whose look-ups go through librdkafka's admin
    client, and for that client."""

    def lookups(self) -> None:
        return None

    def admin(self) -> FakeAdmin:
        return self

    def __init__(self, ops: dict[str, set[str] | Exception]) -> None:
        self.ops = ops
        self.asked: list[str] = []

    def _answer(self, name: str) -> Future[Any]:
        self.asked.append(name)
        f: Future[Any] = Future()
        got = self.ops[name]
        if isinstance(got, Exception):
            f.set_exception(got)
        else:
            f.set_result(SimpleNamespace(authorized_operations=[
                SimpleNamespace(name=op) for op in sorted(got)]))
        return f

    def describe_topics(self, topics: Any, **kw: Any) -> dict[str, Future[Any]]:
        return {t: self._answer(t) for t in topics.topic_names}

    def describe_consumer_groups(self, groups: list[str], **kw: Any) -> dict[str, Future[Any]]:
        return {g: self._answer(g) for g in groups}


def _denied() -> Exception:
    from confluent_kafka import KafkaError, KafkaException

    return KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))


def _missing() -> Exception:
    from confluent_kafka import KafkaError, KafkaException

    return KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))


CONF = {"bootstrap.servers": "b:9092", "sasl.username": "alice"}


def test_acls_held_missing_and_not_checkable() -> None:
    admin = FakeAdmin({"in": {"READ", "DESCRIBE"}, "g": {"DESCRIBE"}})
    checks = cluster.acl_checks(admin, CONF, {"topic": "in", "group": "g"}, 5.0)
    found = {c.name.split(" for ")[0]: c for c in checks}
    # every role whose names are given, and only those
    assert {n.removeprefix("ACLs of ") for n in found} == {
        "`eo_kafka` source, streaming (`readStream`)",
        "`eo_kafka` source with `startingOffsets=group`", "`KafkaWindows` (batch windows)",
        "`python -m connectors lag`", "`eo_kafka` sink, recovery-key mode (the default)"}
    sink = found["ACLs of `eo_kafka` sink, recovery-key mode (the default)"]
    assert sink.status == "FAIL" and "MISSING: WRITE on Topic 'in'" in sink.found
    only = cluster.acl_checks(admin, CONF, {"topic": "in", "group": "g"}, 5.0, only=["lag"])
    assert [c.name for c in only] == ["ACLs of `python -m connectors lag` for User:alice"]
    lag = found["ACLs of `python -m connectors lag`"]
    assert lag.status == "ok" and "DESCRIBE on Group 'g'" in lag.found
    source = found["ACLs of `eo_kafka` source, streaming (`readStream`)"]
    assert source.status == "FAIL" and "MISSING: READ on Group 'g'" in source.found
    assert "kafka-acls.sh --add --allow-principal User:alice --operation Read --group 'g'" \
        in source.todo
    assert "User:alice" in source.name


def test_a_topic_that_does_not_exist_is_named_so() -> None:
    admin = FakeAdmin({"typo": _missing(), "g": {"READ", "DESCRIBE"}})
    checks = cluster.acl_checks(admin, CONF, {"topic": "typo", "group": "g"}, 5.0)
    lag = next(c for c in checks if "lag" in c.name)
    assert "Topic 'typo': does not exist here (nothing was created)" in lag.found
    assert lag.status == "ok"  # the group part is held; the topic's cannot be told


def test_a_denied_describe_is_a_missing_acl_and_transactional_ids_are_named() -> None:
    admin = FakeAdmin({"out": _denied(), "eo-sink-s-w0": {"READ", "DESCRIBE"},
                       DEFAULT_FACTS_TOPIC: {"READ", "DESCRIBE"}})
    names = {"topic": "out", "sink_id": "s", "facts_topic": DEFAULT_FACTS_TOPIC}
    checks = cluster.acl_checks(admin, CONF, names, 5.0)
    txn = next(c for c in checks if "transactional=true" in c.name)
    assert txn.status == "FAIL"
    assert "WRITE on Topic 'out': denied (not even DESCRIBE)" in txn.found
    assert "WRITE on TransactionalId prefix 's-'" in txn.found and "not checked" in txn.found
    assert "--operation Write --topic 'out'" in txn.todo
    assert admin.asked.count("eo-sink-s-w0") == 1  # a prefixed ACL: one name it covers


def test_every_operation_granted_is_ok_for_every_role() -> None:
    every = {"READ", "WRITE", "CREATE", "DESCRIBE", "DELETE", "ALTER", "DESCRIBE_CONFIGS",
             "ALTER_CONFIGS"}
    names = {"topic": "t", "group": "g", "sink_id": "s", "facts_topic": "f"}
    admin = FakeAdmin({"t": every, "g": every, "eo-sink-s-w0": every, "f": every})
    checks = cluster.acl_checks(admin, CONF, names, 5.0)
    assert len(checks) == len(ROLES) and all(c.status == "ok" for c in checks), checks


def test_without_names_it_says_what_each_role_needs() -> None:
    (check,) = cluster.acl_checks(None, CONF, {}, 5.0)
    assert check.status == "skip" and "lag: --group --topic" in check.todo


def test_the_cli_s_facts_topic_default_and_roles_are_the_sink_s_and_the_declared() -> None:
    args = cli.build_parser().parse_args(["doctor"])
    assert args.facts_topic == doctor.FACTS_TOPIC == DEFAULT_FACTS_TOPIC
    assert set(doctor.ROLE_NAMES) == set(ROLES)


def test_acl_flags_need_a_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["doctor", "--topic", "t"]) == 2
    assert "give --bootstrap" in capsys.readouterr().err


# -- storage -------------------------------------------------------------------------------------
def test_a_local_path_is_probed_and_nothing_is_left(tmp_path: Any,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from connectors.core.storage import forget_probes

    forget_probes()
    missing = tmp_path / "not" / "yet"
    code, doc, _ = run(capsys, "--path", str(missing))
    check = by_name(doc)[f"storage {missing}"]
    assert check["status"] == "ok" and "create-if-absent enforced" in check["found"]
    assert f"probed in file://{tmp_path}" in check["found"]
    assert not (tmp_path / "not").exists() and list(tmp_path.iterdir()) == []
    forget_probes()


def test_storage_options_need_a_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["doctor", "--storage", "endpoint=http://h:9000"]) == 2
    assert "give --path" in capsys.readouterr().err
