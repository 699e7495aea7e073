"""A secured Apache Kafka for the test tier: SASL_SSL with SCRAM-SHA-512 and ACLs.

:class:`SecuredKafka` is :class:`connectors.demo.services.kafka.ApacheKafka` (the same
Maven-resolved jars, one KRaft node) with a second listener, ``SASL_SSL`` on a free loopback
port, and:

- TLS from a throwaway CA made at start-up (``cryptography``): a server certificate for
  ``127.0.0.1``/``localhost`` in a PEM keystore, the CA in ``ca.pem`` for the clients;
- SCRAM-SHA-512 users created through the admin API (``alter_user_scram_credentials``);
- KRaft's ``StandardAuthorizer`` with ``allow.everyone.if.no.acl.found=false``: a principal
  can do only what an ACL grants it.

Super users: ``User:admin`` (the tests' set-up principal, on the secured listener) and
``User:ANONYMOUS``, which is what the node's own PLAINTEXT traffic (controller listener,
inter-broker listener) authenticates as. The PLAINTEXT listener stays for that traffic and
for the readiness check only; no test client uses it (:attr:`bootstrap` is the secured one).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import logging
import secrets
from pathlib import Path
from typing import Any

from connectors.demo.services.kafka import ApacheKafka, free_port

log = logging.getLogger(__name__)

MECHANISM = "SCRAM-SHA-512"
ADMIN = "admin"


def make_tls(directory: Path, name: str = "eo-test") -> tuple[Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost signed by it:
    ``(ca.pem, server.pem)``; ``server.pem`` holds the unencrypted PKCS#8 key, then the
    certificate chain (Kafka's PEM keystore format)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(hours=1))
          .not_valid_after(now + dt.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                       crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False,
                                       decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    directory.mkdir(parents=True, exist_ok=True)
    ca_path, server_path = directory / "ca.pem", directory / "server.pem"
    ca_path.write_bytes(ca.public_bytes(pem))
    server_path.write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                          serialization.NoEncryption())
        + cert.public_bytes(pem) + ca.public_bytes(pem))
    return ca_path, server_path


#: The secured listener's session lifetime (``connections.max.reauth.ms``).
REAUTH_MS = 4000


class SecuredKafka:
    """Apache Kafka with a ``SASL_SSL`` (SCRAM-SHA-512) listener and ACLs enforced.

    :meth:`client_conf` gives a principal's librdkafka settings, :meth:`add_user` makes a
    principal, :meth:`grant`/:meth:`revoke` manage its ACLs as the super user ``admin``.
    """

    def __init__(self, workdir: str) -> None:
        self.workdir = Path(workdir)
        self.secure_port = free_port()
        self.bootstrap = f"127.0.0.1:{self.secure_port}"
        self.ca_path, self.server_pem = make_tls(self.workdir / "tls")
        self.passwords: dict[str, str] = {ADMIN: secrets.token_urlsafe(16)}
        self._broker: ApacheKafka | None = None
        self._admin: Any = None

    # -- the broker ------------------------------------------------------------------------
    def start(self) -> SecuredKafka:
        port = free_port()
        self._broker = ApacheKafka(workdir=str(self.workdir / "kafka"), port=port, keep=True)
        self._broker.extra.update(self._properties(port, self._broker.controller_port))
        self._broker.start()
        self._plain_admin().alter_user_scram_credentials([self._scram(ADMIN)])
        self.wait_for_user(ADMIN)
        log.info("secured Apache Kafka %s: SASL_SSL/%s on %s", self.version, MECHANISM,
                 self.bootstrap)
        return self

    def _properties(self, port: int, controller_port: int) -> dict[str, str]:
        # Appended after ApacheKafka's own server.properties: a key given twice takes its
        # last value, so these replace the listener lines.
        b = controller_port
        return {
            "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{b},"
                         f"SASL_SSL://127.0.0.1:{self.secure_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port},"
                                    f"SASL_SSL://127.0.0.1:{self.secure_port}",
            "listener.security.protocol.map":
                "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL",
            "sasl.enabled.mechanisms": MECHANISM,
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.server_pem),
            "ssl.client.auth": "none",
            "authorizer.class.name":
                "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{ADMIN};User:ANONYMOUS",
            # KIP-368: a SASL session lasts 4 s; a client must log in again (librdkafka
            # re-authenticates, the wire path opens a new connection) or the broker closes
            # the connection at its next request.
            "connections.max.reauth.ms": str(REAUTH_MS),
        }

    @property
    def version(self) -> str:
        return self._broker.version if self._broker else "?"

    @property
    def setup_bootstrap(self) -> str:
        """The PLAINTEXT listener (super user ``ANONYMOUS``): for creating topics, producing
        test data and reading results back, never for the client under test."""
        assert self._broker is not None  # noqa: S101 - test service
        return self._broker.bootstrap

    @property
    def log_path(self) -> str | None:
        return self._broker.log_path if self._broker else None

    def stop(self) -> None:
        self._admin = None
        if self._broker is not None:
            self._broker.stop()
            self._broker = None

    def tool(self, main_class: str, *args: str) -> str:
        assert self._broker is not None  # noqa: S101 - test service
        return self._broker.tool(main_class, *args)

    # -- clients ---------------------------------------------------------------------------
    def client_conf(self, user: str, *, password: str | None = None,
                    mechanism: str = MECHANISM, ca: str | None = None) -> dict[str, str]:
        """librdkafka settings of ``user`` on the secured listener (keys without
        ``kafka.``); ``password``, ``mechanism`` and ``ca`` override for bad-input tests."""
        return {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": mechanism,
            "sasl.username": user,
            "sasl.password": self.passwords[user] if password is None else password,
            "ssl.ca.location": ca or str(self.ca_path),
        }

    def spark_options(self, user: str, **override: Any) -> dict[str, str]:
        """:meth:`client_conf` as Spark options (``kafka.``-prefixed)."""
        return {f"kafka.{k}": v for k, v in self.client_conf(user, **override).items()}

    def admin(self) -> Any:
        """An AdminClient of the super user ``admin`` on the secured listener."""
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            self._admin = AdminClient(self.client_conf(ADMIN))
        return self._admin

    def _plain_admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        assert self._broker is not None  # noqa: S101 - test service
        return _Futures(AdminClient({"bootstrap.servers": self._broker.bootstrap}))

    def _scram(self, user: str) -> Any:
        from confluent_kafka.admin import (
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        return UserScramCredentialUpsertion(
            user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
            self.passwords[user].encode())

    def add_user(self, user: str) -> dict[str, str]:
        """A SCRAM-SHA-512 principal ``User:<user>`` with no ACLs; its client settings."""
        if user not in self.passwords:
            self.passwords[user] = secrets.token_urlsafe(16)
            _Futures(self.admin()).alter_user_scram_credentials([self._scram(user)])
            self.wait_for_user(user)
        return self.client_conf(user)

    def wait_for_user(self, user: str, timeout: float = 30.0) -> None:
        """Until ``user`` can authenticate on the secured listener (SCRAM credentials reach
        the broker through the metadata log)."""
        from confluent_kafka.admin import AdminClient

        from connectors.core.retry import poll_until

        def works() -> bool:
            try:
                AdminClient(self.client_conf(user)).list_topics(timeout=3)
                return True
            except Exception:  # noqa: BLE001 - not yet
                return False

        if not poll_until(works, timeout=timeout, interval=0.2):
            raise RuntimeError(f"SCRAM user {user!r} cannot authenticate after {timeout}s "
                               f"(log {self.log_path})")

    # -- ACLs ------------------------------------------------------------------------------
    def grant(self, user: str, acls: list[tuple[str, str, str, str]]) -> None:
        """Allow ``(resource type, name, pattern type, operation)`` rows for ``user``, e.g.
        ``("TOPIC", "orders", "LITERAL", "READ")``; wait until the authorizer applies them."""
        if acls:
            _Futures(self.admin()).create_acls([binding(user, *a) for a in acls])
            self._wait_acls(user, set(acls), present=True)

    def revoke(self, user: str, acls: list[tuple[str, str, str, str]]) -> None:
        if acls:
            _Futures(self.admin()).delete_acls([binding(user, *a, filter=True) for a in acls])
            self._wait_acls(user, set(acls), present=False)

    def acls_of(self, user: str) -> set[tuple[str, str, str, str]]:
        from confluent_kafka.admin import (
            AclBindingFilter,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        flt = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, f"User:{user}",
                               None, AclOperation.ANY, AclPermissionType.ANY)
        got = self.admin().describe_acls(flt, request_timeout=10).result()
        return {(b.restype.name, b.name, b.resource_pattern_type.name, b.operation.name)
                for b in got}

    def _wait_acls(self, user: str, acls: set[tuple[str, str, str, str]],
                   present: bool) -> None:
        from connectors.core.retry import poll_until

        def applied() -> bool:
            have = self.acls_of(user)
            return acls <= have if present else not (acls & have)

        if not poll_until(applied, timeout=30, interval=0.1):
            raise RuntimeError(f"ACLs of {user!r} not applied in 30s: {sorted(acls)}")


def binding(user: str, restype: str, name: str, pattern: str, operation: str,
            filter: bool = False) -> Any:  # noqa: A002 - AclBindingFilter's own word
    """An ALLOW AclBinding of ``User:<user>`` from any host (``filter``: the
    AclBindingFilter matching exactly it, for ``delete_acls``)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    kind = AclBindingFilter if filter else AclBinding
    return kind(ResourceType[restype], name, ResourcePatternType[pattern],
                      f"User:{user}", "*", AclOperation[operation], AclPermissionType.ALLOW)


class _Futures:
    """An AdminClient whose calls wait for every future they return (errors raise)."""

    def __init__(self, admin: Any) -> None:
        self._admin = admin

    def __getattr__(self, name: str) -> Any:
        call = getattr(self._admin, name)

        def waited(*args: Any, **kw: Any) -> Any:
            kw.setdefault("request_timeout", 30)
            futures = call(*args, **kw)
            for f in (futures.values() if isinstance(futures, dict) else [futures]):
                f.result()
            return futures

        return waited
