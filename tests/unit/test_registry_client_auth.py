"""The registry client's credentials: given in the URL (as confluent-kafka's client takes
them) or in ``basic.auth.user.info``, never both, and never shown; what a 401/403 says.
The same against a real registry behind nginx: tests/integration/test_schema_registry_auth.py."""

from __future__ import annotations

import pytest

from connectors.core.errors import OptionError
from connectors.kafka.registry.client import RegistryClient, RegistrySpec


def test_credentials_in_the_url_become_basic_auth_and_leave_the_url() -> None:
    spec = RegistrySpec.parse("eo_kafka", {"url": "http://al%40ce:p%3Aw-secret@r:8081/apis/x/"})
    assert spec.user_info is not None and spec.user_info.get() == "al@ce:p:w-secret"
    assert spec.urls == ("http://r:8081/apis/x",) and spec.credentials_in_url
    assert "secret" not in repr(spec) + spec.shown_urls()
    plain = RegistrySpec.parse("eo_kafka", {"url": "http://r:8081",
                                            "basic.auth.user.info": "u:pw-secret"})
    assert plain.urls == ("http://r:8081",) and not plain.credentials_in_url


@pytest.mark.parametrize("values", [
    {"url": "http://u:pw-secret@r:8081", "basic.auth.user.info": "u:other-secret"},
    {"url": "http://u:pw-secret@r:8081,http://v:other-secret@s:8081"},
])
def test_credentials_given_twice_are_refused_without_showing_them(values: dict[str, str]) -> None:
    with pytest.raises(OptionError, match="schemaRegistry.url.*carries credentials") as e:
        RegistrySpec.parse("eo_kafka", values)
    assert "secret" not in str(e.value)


@pytest.mark.parametrize(("values", "status", "says"), [
    ({"url": "http://r:1"}, 401, "no credentials were sent; set "
                                 "schemaRegistry.basic.auth.user.info"),
    ({"url": "http://r:1", "basic.auth.user.info": "u:pw-secret"}, 401,
     "schemaRegistry.basic.auth.user.info was not accepted"),
    ({"url": "http://u:pw-secret@r:1"}, 401,
     "the user:password in schemaRegistry.url was not accepted"),
    ({"url": "http://r:1", "basic.auth.user.info": "u:pw-secret"}, 403,
     "as forbidden (HTTP 403: Forbidden): schemaRegistry.basic.auth.user.info was accepted, "
     "but that user may not do this"),
])
def test_a_refusal_names_the_url_and_the_option_not_the_password(
        values: dict[str, str], status: int, says: str) -> None:
    client = RegistryClient(RegistrySpec.parse("eo_kafka", values))
    text = client._refused("http://r:1", "GET", "/subjects", status,
                           {"code": None, "message": "Forbidden" if status == 403
                            else "Unauthorized"})
    assert says in text and "http://r:1 refused GET /subjects" in text
    assert "secret" not in text
