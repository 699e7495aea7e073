"""Classification and deadline of the retry around Kafka admin and metadata requests."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException

from connectors.core.errors import KafkaSinkError, KafkaSourceError
from connectors.kafka.common import is_transient, retrying


@pytest.mark.parametrize("code", [
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.NOT_COORDINATOR,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError._TIMED_OUT,
])
def test_transient_codes_are_retried(code: int) -> None:
    assert is_transient(KafkaException(KafkaError(code)))
    assert is_transient(KafkaError(code))


@pytest.mark.parametrize("code", [
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError.INVALID_REQUEST,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
])
def test_permanent_codes_are_not(code: int) -> None:
    assert not is_transient(KafkaException(KafkaError(code)))


def test_librdkafkas_retriable_flag_counts_and_fatal_never() -> None:
    assert is_transient(KafkaException(KafkaError(KafkaError.INVALID_REQUEST, retriable=True)))
    assert not is_transient(
        KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION, fatal=True)))
    assert not is_transient(ValueError("not Kafka"))


def test_asks_again_until_the_call_succeeds() -> None:
    calls = []

    def call() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION))
        return "ok"

    assert retrying(call, what="ListOffsets of t[0]", error=KafkaSinkError,
                    timeout=10, first_backoff=0.001) == "ok"
    assert len(calls) == 4


def test_deadline_gives_one_error_naming_the_call_and_the_last_error() -> None:
    def call() -> None:
        raise KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE))

    started = time.monotonic()
    with pytest.raises(KafkaSourceError) as e:
        retrying(call, what="ListOffsets of orders[3]", error=KafkaSourceError,
                 timeout=0.3, first_backoff=0.01)
    assert time.monotonic() - started < 3
    text = str(e.value)
    assert "ListOffsets of orders[3]" in text and "LEADER_NOT_AVAILABLE" in text
    assert "metadataRetryTimeout" in text


def test_permanent_error_fails_at_once() -> None:
    calls = []

    def call() -> None:
        calls.append(1)
        raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))

    with pytest.raises(KafkaSinkError, match="metadata of topic 'x'"):
        retrying(call, what="metadata of topic 'x'", error=KafkaSinkError, timeout=30)
    assert calls == [1]
