"""The error of an object store without credentials (issue 36, item 7), per provider and
without a network: the client's failed request to the instance-metadata endpoint (its last
credential source) becomes "no credentials were found", naming the URL and every place
credentials can come from. The same on a real S3 server, with a metadata endpoint that
refuses, forbids or hangs: tests/integration/test_storage_no_credentials.py."""

from __future__ import annotations

import pytest

from connectors.core import contact
from connectors.core.errors import StorageError
from connectors.core.storage import storage_for, storage_options_from

#: obstore's messages when each provider's instance identity gave nothing (as seen from a
#: machine without one: the endpoint refuses or a proxy answers 403).
FAILED_IDENTITY = {
    "s3://bkt/wal": (
        "Generic S3 error: Error performing PUT http://169.254.169.254/latest/api/token in "
        "2ms - Server returned non-2xx status code: 403 Forbidden: resolve_deny"),
    "gs://bkt/wal": (
        "Generic GCS error: Error performing token request: Error performing GET "
        "http://169.254.169.254/computeMetadata/v1/instance/service-accounts/default/token in "
        "1ms - HTTP error: error sending request"),
    "abfss://ctr@acct.dfs.core.windows.net/wal": (
        "Generic MicrosoftAzure error: Error performing token request: Error performing GET "
        "http://169.254.169.254/metadata/identity/oauth2/token?api-version=2019-08-01 in 3ms "
        "- HTTP error: error sending request"),
}
NAMED = {
    "s3://bkt/wal": ("storage.accessKeyId", "AWS_ACCESS_KEY_ID", "EC2 instance profile",
                     "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_PROFILE",
                     "/.aws/credentials"),
    "gs://bkt/wal": ("storage.serviceAccountPath", "GOOGLE_APPLICATION_CREDENTIALS",
                     "metadata server's service account"),
    "abfss://ctr@acct.dfs.core.windows.net/wal": ("storage.accountKey", "AZURE_STORAGE_ACCOUNT_KEY",
                     "Azure managed identity"),
}


@pytest.mark.parametrize("url", sorted(FAILED_IDENTITY))
def test_a_failed_identity_request_says_no_credentials_were_found(
        url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import obstore
    from obstore.exceptions import GenericError

    def put(*args: object, **kwargs: object) -> None:
        raise GenericError(FAILED_IDENTITY[url])

    # The first contact's HEAD meets the same: the client's own verdict, raised at once.
    monkeypatch.setattr(obstore, "head", put)
    monkeypatch.setattr(obstore, "put", put)
    contact.forget()
    storage, root = storage_for(url, options=None)
    with pytest.raises(StorageError) as raised:
        storage.create(root + "/x", b"1")
    message = str(raised.value)
    assert f"{url}/x" in message and "no credentials were found" in message, message
    assert "instance identity" in message and "storage.* options" in message
    for where in NAMED[url]:
        assert where in message, (where, message)
    assert "unreachable" not in message


def test_a_store_that_cannot_be_reached_is_still_unreachable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Never answered: the first contact's HEAD meets only silence until
    storage.connectTimeout, and says so, naming the endpoint and the option."""
    import obstore
    from obstore.exceptions import GenericError

    asked: list[object] = []

    def silence(*args: object, **kwargs: object) -> None:
        asked.append(args)
        raise GenericError("Generic S3 error: Error performing HEAD http://10.1.2.3:9000/bkt/x "
                           "in 0.1s - HTTP error: error sending request")

    monkeypatch.setattr(obstore, "head", silence)
    monkeypatch.setattr(obstore, "put", silence)
    contact.forget()
    storage, root = storage_for("s3://bkt/wal", options=storage_options_from(
        {"connectTimeout": "300ms"}, "t"))
    with pytest.raises(StorageError) as raised:
        storage.create(root + "/x", b"1")
    message = str(raised.value)
    assert "the store is unreachable at http://10.1.2.3:9000" in message, message
    assert "storage.connectTimeout=0.3s" in message and "storage.endpoint" in message
    assert "storage.retryTimeout=120s" in message  # what an outage would be given
    assert len(asked) > 1 and not contact.reached(storage.identity())


def test_a_store_that_answered_before_says_how_long_and_which_option_to_raise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An outage of a store this process reached: obstore spent the budget on the request;
    the error says how long, how many tries and which option to raise."""
    import obstore
    from obstore.exceptions import GenericError

    def put(*args: object, **kwargs: object) -> None:
        raise GenericError("Generic S3 error: Error performing PUT http://10.1.2.3:9000/bkt/x "
                           "in 120.3s, after 63 retries, max_retries: 100, retry_timeout: 120s "
                           "- HTTP error: error sending request")

    monkeypatch.setattr(obstore, "put", put)
    monkeypatch.setattr(obstore, "head", lambda *a, **k: pytest.fail("no first contact"))
    contact.forget()
    storage, root = storage_for("s3://bkt/wal", options=None)
    contact.mark(storage.identity())
    with pytest.raises(StorageError) as raised:
        storage.create(root + "/x", b"1")
    message = str(raised.value)
    assert "the store is unreachable at http://10.1.2.3:9000, which answered" in message
    assert ("tried 64 times over 120.3s; the retry budget is storage.retryTimeout=120s and "
            "storage.maxRetries=100: raise them") in message, message
    contact.forget()
