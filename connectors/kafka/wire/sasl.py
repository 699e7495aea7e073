"""SASL for the wire path's connections (:mod:`connectors.kafka.wire.protocol`):
PLAIN and SCRAM-SHA-256/512 (RFC 5802, RFC 7677), as Kafka speaks them with
``SaslHandshake`` v1 and ``SaslAuthenticate`` v1.

Other mechanisms (GSSAPI, OAUTHBEARER) are not spoken here: the sink then produces through
librdkafka (``connectors.kafka.clients``). The password is never logged, put in an error or shown by
``repr``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_HASHES = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}
#: The SCRAM iteration counts a Kafka broker can ask for (Kafka's ScramMechanism: credentials
#: are stored with 4,096 to 16,384). Anything else is refused, as Java's client refuses fewer
#: than 4,096: a server asking for 1 weakens the proof, one asking for 2^31 stalls the task.
SCRAM_ITERATIONS = (4096, 16384)
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36


@dataclass(frozen=True)
class Login:
    """``sasl.mechanism``, ``sasl.username`` and ``sasl.password`` of the configuration."""

    mechanism: str
    username: str
    password: str = field(repr=False)

    @classmethod
    def of(cls, conf: Mapping[str, Any]) -> Login | None:
        if not str(conf.get("security.protocol", "plaintext")).lower().startswith("sasl_"):
            return None
        mechanism = mechanism_of(conf)
        return cls(mechanism, str(conf.get("sasl.username", "")),
                   str(conf.get("sasl.password", "")))


def mechanism_of(conf: Mapping[str, Any]) -> str:
    """The SASL mechanism librdkafka would use (its default is GSSAPI)."""
    return str(conf.get("sasl.mechanism", conf.get("sasl.mechanisms", "GSSAPI"))).upper()


class SaslFailed(Exception):
    """The broker refused the login; the text names Kafka's error, never the secret."""


def authenticate(call: Callable[[int, bytes], Any], login: Login) -> int:
    """Log in on a new connection; ``call(api, body)`` sends a request and returns the
    answer's reader (protocol.Connection.call). Returns the session's lifetime in ms
    that the broker announced (KIP-368; 0: no limit)."""
    r = call(SASL_HANDSHAKE, _string(login.mechanism))
    error = r.take(">h")
    offered = r.array(r.string)
    if error:
        raise SaslFailed(f"SaslHandshake: UNSUPPORTED_SASL_MECHANISM ({login.mechanism}; the "
                         f"listener offers {', '.join(offered)})")

    lifetime = [0]

    def step(payload: bytes) -> bytes:
        r = call(SASL_AUTHENTICATE, struct.pack(">i", len(payload)) + payload)
        error = r.take(">h")
        message = r.string()
        n = r.take(">i")
        data = bytes(r.data[r.at:r.at + max(n, 0)])
        r.at += max(n, 0)
        if error:
            raise SaslFailed(f"SASL_AUTHENTICATION_FAILED: {message or 'error ' + str(error)} "
                             f"(sasl.username, sasl.password, sasl.mechanism)")
        lifetime[0] = r.take(">q")  # v1: session_lifetime_ms
        return data

    if login.mechanism == "PLAIN":
        step(b"\0" + login.username.encode() + b"\0" + login.password.encode())
    else:
        _scram(step, login)
    return int(lifetime[0])


def _scram(step: Callable[[bytes], bytes], login: Login) -> None:
    digest = _HASHES[login.mechanism]
    user = login.username.replace("=", "=3D").replace(",", "=2C")
    nonce = base64.b64encode(os.urandom(18)).decode()
    first_bare = f"n={user},r={nonce}"
    server_first = step(f"n,,{first_bare}".encode()).decode()
    fields = dict(item.split("=", 1) for item in server_first.split(","))
    if not fields.get("r", "").startswith(nonce):
        raise SaslFailed("SASL_AUTHENTICATION_FAILED: the server's SCRAM nonce does not "
                         "extend ours")
    try:
        iterations = int(fields.get("i", ""))
    except ValueError:
        iterations = -1
    low, high = SCRAM_ITERATIONS
    if not low <= iterations <= high:
        raise SaslFailed(f"SASL_AUTHENTICATION_FAILED: the server asked for {fields.get('i')!r} "
                         f"SCRAM iterations; a Kafka broker asks for {low} to {high} (not the "
                         "broker we meant to log in to?)")
    salted = hashlib.pbkdf2_hmac(digest().name, login.password.encode(),
                                 base64.b64decode(fields["s"]), iterations)
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    final_bare = f"c=biws,r={fields['r']}"
    message = f"{first_bare},{server_first},{final_bare}".encode()
    signature = hmac.new(digest(client_key).digest(), message, digest).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    server_final = step(f"{final_bare},p={base64.b64encode(proof).decode()}".encode()).decode()
    server_key = hmac.new(salted, b"Server Key", digest).digest()
    expected = base64.b64encode(hmac.new(server_key, message, digest).digest()).decode()
    if not hmac.compare_digest(server_final.partition("v=")[2], expected):
        raise SaslFailed("SASL_AUTHENTICATION_FAILED: the server's SCRAM signature does not "
                         "match (not the broker we logged in to?)")


def _string(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">h", len(b)) + b
