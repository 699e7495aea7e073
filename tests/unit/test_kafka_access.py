"""connectors.kafka.access without a broker: the messages and the transient rule."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from connectors.kafka.access import ROLES, denied, is_access_error
from connectors.kafka.common import is_transient

CONF = {"bootstrap.servers": "b:9093", "sasl.username": "etl", "sasl.password": "s3cret!"}


def test_a_denied_request_names_principal_resource_operation_and_the_grant() -> None:
    needs = [a.bind(sink_id="orders", topic="t", facts_topic="f")
             for a in ROLES["transactional-sink"]]
    err = KafkaException(KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
    message = denied(err, who="eo_kafka orders", conf=CONF, needs=needs, request="InitProducerId")
    assert message is not None
    assert "User:etl has no WRITE on TransactionalId prefix 'orders-'" in message
    assert ("kafka-acls.sh --add --allow-principal User:etl --operation Write "
            "--transactional-id 'orders-' --resource-pattern-type prefixed") in message
    assert "s3cret!" not in message


def test_only_the_acls_of_the_denied_resource_type_are_named() -> None:
    needs = [a.bind(topic="t", group="g") for a in ROLES["source"]]
    err = KafkaException(KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED))
    message = denied(err, who="eo_kafka", conf=CONF, needs=needs, request="OffsetCommit") or ""
    assert "READ on Group 'g'" in message and "Topic" not in message


def test_access_errors_are_never_transient_and_others_are_not_mapped() -> None:
    for code in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
                 KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._AUTHENTICATION):
        err = KafkaException(KafkaError(code, retriable=True))
        assert is_access_error(err)
        assert not is_transient(err)
    other = KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE))
    assert not is_access_error(other) and is_transient(other)
    assert denied(other, who="x", conf=CONF, needs=[], request="r") is None


def test_a_failed_login_points_at_the_setting_never_at_its_value() -> None:
    err = KafkaException(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: "
                                    "Authentication failed due to invalid credentials"))
    message = denied(err, who="eo_kafka", conf=CONF, needs=[], request="connecting") or ""
    assert "kafka.sasl.password" in message and "s3cret!" not in message
    tls = KafkaException(KafkaError(KafkaError._SSL, "SSL handshake failed: certificate "
                                    "verify failed"))
    assert "kafka.ssl.ca.location" in (denied(tls, who="x", conf=CONF, needs=[],
                                              request="r") or "")
