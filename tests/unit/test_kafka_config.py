"""kafka.* settings checked when options are parsed (issue 23, item 4), and secrets kept out
of errors, logs and repr() (item 5): the source, the sink and KafkaWindows."""

from __future__ import annotations

import logging
import os
import pickle
import socket
import time
from typing import Any

import pytest

from connectors.core.errors import KafkaSinkError, OptionError
from connectors.core.options import RedactedDict, is_secret, scrub_known
from connectors.kafka.common import LIBRDKAFKA_LOG, is_transient
from connectors.kafka.config import CONFIGURATION_URL, PROPERTIES, check_client_config
from connectors.kafka.connect import ConnectWatch, diagnose, first_contact
from connectors.kafka.sink import KafkaSink
from connectors.kafka.sink.options import KafkaSinkOptions
from connectors.kafka.source.options import KafkaSourceOptions
from connectors.kafka.source.windows import KafkaWindows

MARKER = "m4rk3r-s3cret-7f1c"


def source(**extra: str) -> KafkaSourceOptions:
    options = {"kafka.bootstrap.servers": "h:9092", "subscribe": "t",
               "kafka.sasl.password": MARKER, **extra}
    # Spark lower-cases option keys.
    return KafkaSourceOptions.from_options({k.lower(): v for k, v in options.items()})


def sink(tmp: Any, **extra: str) -> KafkaSinkOptions:
    return KafkaSinkOptions.from_options({
        "kafka.bootstrap.servers": "h:9092", "sink_id": "s", "walPath": str(tmp),
        "kafka.sasl.password": MARKER, **extra})


def windows(tmp: Any, **extra: str) -> KafkaWindows:
    return KafkaWindows(None, str(tmp), **{"kafka.bootstrap.servers": "h:9092",
                                           "subscribe": "t", "kafka.sasl.password": MARKER,
                                           **extra})


def refused(make: Any) -> str:
    with pytest.raises(OptionError) as e:
        make()
    message = str(e.value)
    assert MARKER not in message
    return message


# -- item 4: librdkafka checks the configuration at parse time ---------------------------------
@pytest.mark.parametrize("component", ["source", "sink", "windows"])
def test_an_unknown_property_names_the_option_and_the_nearest_valid_one(component: str,
                                                                         tmp_path: Any) -> None:
    make = {"source": lambda: source(**{"kafka.fetch.max.bytez": "1"}),
            "sink": lambda: sink(tmp_path, **{"kafka.fetch.max.bytez": "1"}),
            "windows": lambda: windows(tmp_path, **{"kafka.fetch.max.bytez": "1"})}[component]
    message = refused(make)
    assert "option 'kafka.fetch.max.bytez' is not a librdkafka property" in message
    assert "did you mean 'kafka.fetch.max.bytes'" in message and CONFIGURATION_URL in message


def test_the_python_api_names_the_key_of_kafka_options(tmp_path: Any) -> None:
    message = refused(lambda: KafkaSink("s", str(tmp_path), bootstrap_servers="h:9092",
                                        kafka_options={"fetch.max.bytez": 1}))
    assert """kafka_options["fetch.max.bytez"]""" in message
    assert """did you mean 'kafka_options["fetch.max.bytes"]'""" in message


@pytest.mark.parametrize(("key", "value", "says"), [
    ("kafka.security.protocol", "SASL_SSLL", "did you mean 'SASL_SSL'"),
    ("kafka.sasl.mechanism", "SCRAM-SHA-999", "SCRAM-SHA-512"),
    ("kafka.sasl.mechanism", "plain", "did you mean 'PLAIN'"),
    ("kafka.fetch.max.bytes", "lots", CONFIGURATION_URL),
    ("kafka.linger.ms", "soon", "queue.buffering.max.ms"),  # an alias: named as written
    ("kafka.isolation.level", "read_most", "isolation.level"),
])
def test_an_invalid_value_names_the_option(key: str, value: str, says: str,
                                           tmp_path: Any) -> None:
    for make in (lambda: source(**{key: value}), lambda: sink(tmp_path, **{key: value})):
        message = refused(make)
        assert f"option '{key}'" in message and says in message


def test_the_option_keeps_the_users_spelling() -> None:
    message = refused(lambda: KafkaSourceOptions.from_options({
        "kafka.bootstrap.servers": "h:1", "subscribe": "t", "kafka.Fetch.Max.Bytez": "1"}))
    assert "'kafka.Fetch.Max.Bytez'" in message


def test_a_setting_of_a_clusters_entry_names_the_entry() -> None:
    clusters = '[{"name": "east", "bootstrap": "h:1", "subscribe": "t", "kafka.fetch.wait.ms": 5}]'
    message = refused(lambda: KafkaSourceOptions.from_options({"clusters": clusters}))
    assert "'kafka.fetch.wait.ms (clusters entry 'east')'" in message
    assert "did you mean 'kafka.fetch.wait.max.ms" in message


def test_a_bad_value_of_a_secret_setting_is_not_echoed(tmp_path: Any) -> None:
    pem = {"kafka.security.protocol": "SSL", "kafka.ssl.key.pem": MARKER + "-pem"}
    message = refused(lambda: source(**pem))
    assert "option 'kafka.ssl.key.pem'" in message and MARKER + "-pem" not in message


def test_producer_settings_pass_the_source_and_consumer_settings_pass_the_sink(
        tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    source(**{"kafka.linger.ms": "5"})  # librdkafka ignores it for a consumer, with a warning
    assert "producer property" in caplog.text
    caplog.clear()
    # The sink's recovery scan is a consumer and takes it: no warning.
    conf = sink(tmp_path, **{"kafka.fetch.max.bytes": "1048576"}).producer_conf
    assert conf["fetch.max.bytes"] == "1048576" and "consumer property" not in caplog.text


def test_every_listed_property_is_known_to_the_installed_librdkafka() -> None:
    from confluent_kafka import Producer

    unknown = []
    for name in PROPERTIES:
        try:
            Producer({name: "x", "log_level": 0})
        except Exception as e:  # noqa: BLE001 - an invalid value is fine, an unknown name not
            if "No such configuration property" in str(e):
                unknown.append(name)
    assert unknown == []


def test_the_check_connects_nowhere() -> None:
    """Not to the bootstrap servers, and not to an OIDC token endpoint (which a client of
    that mechanism calls as soon as it starts)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.5)
    here = f"127.0.0.1:{listener.getsockname()[1]}"
    try:
        check_client_config("eo_kafka", {
            "bootstrap.servers": here, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
            "sasl.oauthbearer.client.id": "c", "sasl.oauthbearer.client.secret": MARKER,
            "sasl.oauthbearer.token.endpoint.url": f"http://{here}/token",
            "group.id": "g"}, "consumer")
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()


# -- item 4: the connect bound and the diagnosis -----------------------------------------------
SASL_ON_PLAIN = ("_AUTHENTICATION", "sasl_plaintext://h:9092/bootstrap: SASL PLAIN mechanism "
                 "handshake failed: Broker: Request not valid in current SASL state: broker's "
                 "supported mechanisms:  (after 0ms in state AUTH_HANDSHAKE)")
TLS_ON_PLAIN = ("_TRANSPORT", "sasl_ssl://h:9092/bootstrap: SSL handshake failed: Disconnected: "
                "SSL connection closed by peer: connecting to a PLAINTEXT broker listener?")
PLAIN_ON_TLS = ("_TRANSPORT", "h:9092/bootstrap: Disconnected while requesting ApiVersion: "
                "might be caused by incorrect security.protocol configuration (connecting to "
                "a SSL listener?) or broker version is < 0.10")
BAD_PASSWORD = ("_AUTHENTICATION", "sasl_ssl://h:9092/bootstrap: SASL authentication error: "
                "Authentication failed: Invalid username or password")
REFUSED = ("_TRANSPORT", "h:9092/bootstrap: Connect to ipv4#127.0.0.1:9092 failed: Connection "
           "refused (after 0ms in state CONNECT)")


class _Err:
    def __init__(self, name: str, text: str) -> None:
        self._name, self._text = name, text

    def name(self) -> str:
        return self._name

    def str(self) -> str:
        return self._text


def _watch(*errors: tuple[str, str]) -> ConnectWatch:
    watch = ConnectWatch()
    for e in errors:
        watch(_Err(*e))
    return watch


@pytest.mark.parametrize(("error", "first"), [
    (SASL_ON_PLAIN, "security protocol mismatch"),
    (TLS_ON_PLAIN, "security protocol mismatch"),
    (PLAIN_ON_TLS, "security protocol mismatch"),
    (BAD_PASSWORD, "authentication failed"),
])
def test_a_handshake_failure_seen_twice_is_a_verdict_with_the_cause_first(
        error: tuple[str, str], first: str) -> None:
    assert _watch(error).verdict() is None  # once may be a broker restarting
    verdict = _watch(error, error).verdict()
    assert verdict is not None
    conf = {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u",
            "sasl.password": MARKER}
    message = diagnose("eo_kafka", "h:9092", conf, *verdict)
    assert message.startswith(f"eo_kafka: {first}") and "h:9092" in message
    assert MARKER not in message


def test_connection_refused_is_no_verdict() -> None:
    assert _watch(REFUSED, REFUSED, REFUSED).verdict() is None


def test_first_contact_fails_early_on_a_mismatch_and_within_the_bound_otherwise() -> None:
    from connectors.kafka import connect

    class Client:
        def __init__(self, *errors: tuple[str, str]) -> None:
            self.watch = _watch(*errors)

        def poll(self, _timeout: float) -> None:
            pass

        def list_topics(self, timeout: float) -> None:
            time.sleep(timeout)
            raise RuntimeError("Failed to get metadata: Local: Broker transport failure")

    def contact(client: Client, timeout: float, started: float | None = None) -> str:
        connect._WATCHES[client] = client.watch
        began = time.monotonic()
        with pytest.raises(KafkaSinkError) as e:
            first_contact(client, lambda s: client.list_topics(s), timeout=timeout, who="w",
                          bootstrap="h:9092", conf={}, error=KafkaSinkError, started=started)
        return f"{time.monotonic() - began:.2f} {e.value}"

    took, message = contact(Client(SASL_ON_PLAIN, SASL_ON_PLAIN), 10).split(" ", 1)
    assert float(took) < 1 and "security protocol mismatch" in message
    took, message = contact(Client(REFUSED), 0.6).split(" ", 1)
    assert 0.55 < float(took) < 1 and "cannot reach Kafka at h:9092" in message
    assert "Connection refused" in message
    # The bound counts from the start of the call that asked, not from the request.
    took, _ = contact(Client(REFUSED), 1.0, started=time.monotonic() - 0.8).split(" ", 1)
    assert float(took) < 0.5


def test_authentication_failures_are_never_retried() -> None:
    from confluent_kafka import KafkaError, KafkaException

    for code in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED,
                 KafkaError._SSL):
        assert not is_transient(KafkaException(KafkaError(code, retriable=True)))


# -- item 5: secrets --------------------------------------------------------------------------
@pytest.mark.parametrize("key", [
    "sasl.password", "ssl.key.password", "ssl.keystore.password", "ssl.truststore.password",
    "sasl.oauthbearer.client.secret", "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.config", "ssl.key.pem", "ssl_key",
    "sasl.oauthbearer.assertion.private.key.pem",
    "sasl.oauthbearer.assertion.private.key.passphrase", "sasl.jaas.config",
])
def test_every_secret_key_is_redacted(key: str) -> None:
    assert is_secret(key) and is_secret(f"kafka.{key}")
    conf = RedactedDict({key: MARKER, "sasl.username": "alice"})
    assert MARKER not in repr(conf) and MARKER not in str(conf) and "alice" in repr(conf)


def test_not_secret() -> None:
    for key in ("sasl.username", "bootstrap.servers", "security.protocol", "ssl.ca.location"):
        assert not is_secret(key)


def test_repr_of_every_kafka_object_hides_the_password(tmp_path: Any) -> None:
    opts = source()
    sink_opts = sink(tmp_path / "s")
    win = windows(tmp_path / "w")
    made = KafkaSink("s", str(tmp_path / "k"), bootstrap_servers="h:9092",
                     kafka_options={"sasl.password": MARKER})
    for obj in (opts, opts.clusters[0], sink_opts, made, win.options):
        assert MARKER not in repr(obj) and MARKER not in str(obj)
    win.close()


def test_text_from_librdkafka_is_scrubbed_also_after_unpickling() -> None:
    conf = pickle.loads(pickle.dumps(RedactedDict({"sasl.password": MARKER + "-p"})))
    assert conf["sasl.password"] == MARKER + "-p"
    assert scrub_known(f"said {MARKER}-p!") == "said ***!"


def test_librdkafka_log_lines_are_scrubbed(caplog: pytest.LogCaptureFixture) -> None:
    RedactedDict({"ssl.key.password": MARKER + "-log"})
    caplog.set_level(logging.DEBUG, logger=LIBRDKAFKA_LOG.name)
    LIBRDKAFKA_LOG.warning("SSL [rdkafka#producer-1]: key %s rejected", MARKER + "-log")
    assert "key *** rejected" in caplog.text and MARKER not in caplog.text


def test_no_secret_reaches_the_wal_or_the_sink_state(tmp_path: Any) -> None:
    import pyarrow as pa

    made = KafkaSink.from_options({"kafka.bootstrap.servers": "h:9092", "sink_id": "s",
                                   "walPath": str(tmp_path), "topic": "t",
                                   "kafka.sasl.password": MARKER})
    made.check_schema(pa.schema([("value", pa.binary())]))
    for root, _dirs, files in os.walk(tmp_path):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                assert MARKER.encode() not in fh.read()


class _Listener:
    """A loopback listener that answers like a plaintext Kafka broker (``kafka=True``: the
    ApiVersions correlation id comes back) or accepts and closes, like a proxy whose brokers
    are down."""

    def __init__(self, kafka: bool) -> None:
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.kafka = kafka
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import struct

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                if self.kafka:
                    request = conn.recv(14)
                    correlation = struct.unpack(">i", request[8:12])[0]
                    conn.sendall(struct.pack(">iih", 6, correlation, 0))

    def close(self) -> None:
        self.sock.close()


def test_the_probes_tell_a_kafka_listener_from_one_that_closes() -> None:
    from connectors.kafka.connect import speaks_kafka_plaintext, speaks_tls

    kafka, closing = _Listener(kafka=True), _Listener(kafka=False)
    try:
        assert speaks_kafka_plaintext("127.0.0.1", kafka.port)
        assert not speaks_kafka_plaintext("127.0.0.1", closing.port)
        assert not speaks_tls("127.0.0.1", kafka.port)
        assert not speaks_tls("127.0.0.1", closing.port)
    finally:
        kafka.close()
        closing.close()


@pytest.mark.parametrize("kafka", [True, False])
def test_a_closed_tls_handshake_is_a_mismatch_only_if_the_listener_speaks_kafka(
        kafka: bool) -> None:
    """librdkafka says the same when a PLAINTEXT listener drops a TLS client and when a
    proxy with no broker behind it closes every connection: only the first ends the wait."""
    from connectors.kafka import connect

    listener = _Listener(kafka)
    said = (f"sasl_ssl://127.0.0.1:{listener.port}/bootstrap: SSL handshake failed: "
            "Disconnected: SSL connection closed by peer (after 0ms in state SSL_HANDSHAKE)")

    class Client:
        def poll(self, _timeout: float) -> None:
            pass

        def list_topics(self, timeout: float) -> None:
            time.sleep(timeout)
            raise RuntimeError("Failed to get metadata: Local: Broker transport failure")

    client = Client()
    connect._WATCHES[client] = _watch(("_TRANSPORT", said), ("_TRANSPORT", said))
    began = time.monotonic()
    try:
        with pytest.raises(KafkaSinkError) as e:
            first_contact(client, client.list_topics, timeout=1.0, who="w",
                          bootstrap=f"127.0.0.1:{listener.port}",
                          conf={"security.protocol": "SASL_SSL"}, error=KafkaSinkError)
    finally:
        listener.close()
    took = time.monotonic() - began
    if kafka:
        assert "security protocol mismatch" in str(e.value) and took < 0.9
        assert "does not speak TLS" in str(e.value)
    else:
        assert "cannot reach Kafka" in str(e.value) and took >= 0.95


def test_the_tls_probe_completes_a_handshake_with_a_tls_listener(tmp_path: Any) -> None:
    import datetime
    import ssl
    import threading

    pytest.importorskip("cryptography")
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    from connectors.kafka.connect import speaks_kafka_plaintext, speaks_tls

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(1).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(hours=1)).sign(key, hashes.SHA256()))
    (tmp_path / "c.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "k.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (OSError, ssl.SSLError):
                pass

    threading.Thread(target=serve, daemon=True).start()
    try:
        assert speaks_tls("127.0.0.1", port)
        assert not speaks_kafka_plaintext("127.0.0.1", port)
    finally:
        listener.close()
