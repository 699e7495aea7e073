"""Where an object store's credentials come from, and the AWS CLI's shared files for S3.

obstore (Rust's ``object_store``) takes S3 credentials from its configuration, the
environment, web identity, container credentials and the instance profile, but never
reads the files ``aws configure`` writes. :func:`apply_aws_profile` reads them as the AWS CLI
(botocore) does, so one place on a machine configures both:

- the files: ``AWS_SHARED_CREDENTIALS_FILE`` (default ``~/.aws/credentials``, sections
  ``[name]``) and ``AWS_CONFIG_FILE`` (default ``~/.aws/config``, sections ``[default]``
  and ``[profile name]``); a value in the credentials file wins over the config file's;
- the profile: ``AWS_DEFAULT_PROFILE``, else ``AWS_PROFILE``, else ``default``. A profile
  named by either variable must exist in one of the files;
- from the profile: ``aws_access_key_id``, ``aws_secret_access_key``, ``aws_session_token``,
  ``region`` and ``endpoint_url`` (the AWS CLI's own since version 2.13, unless
  ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true``). A profile that gets its credentials another
  way (``role_arn``, ``credential_process``, ``sso_session``, ...) goes through boto3's
  session (``obstore.auth.boto3.Boto3CredentialProvider``) when boto3 is installed; without
  boto3 it is an error saying so.

Precedence, as in the AWS chain: the ``storage.*`` options first, then the environment
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``; web identity with
``AWS_WEB_IDENTITY_TOKEN_FILE``; ``AWS_REGION``/``AWS_DEFAULT_REGION``;
``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``), then the profile, then obstore's own
remaining sources (container credentials, the instance profile). Each fact is decided on
its own: credentials from the environment and the region from the profile is the AWS CLI's
answer too.

Secret values read here are never logged; they are scrubbed from every error
(:func:`profile_secrets`).
"""

from __future__ import annotations

import configparser
import logging
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from connectors.core.errors import StorageError

log = logging.getLogger(__name__)

#: Where each provider's client looks for credentials, in order: for the error that says none
#: was found (the last place, the instance identity, fails with a request to the cloud
#: metadata endpoint, which names neither the missing credentials nor the other places).
#: S3's shared files come between the environment and the identity (:func:`aws_files_looked_at`).
CREDENTIAL_SOURCES = {
    "s3": ("storage.accessKeyId and storage.secretAccessKey, storage.sessionToken",
           "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN; "
           "AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN",
           "container credentials (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or _FULL_URI) and "
           "an EC2 instance profile, asked at the metadata endpoint 169.254.169.254 or "
           "AWS_METADATA_ENDPOINT"),
    "gcs": ("storage.serviceAccountPath or storage.serviceAccountKey",
            "GOOGLE_APPLICATION_CREDENTIALS, GOOGLE_SERVICE_ACCOUNT_PATH, "
            "GOOGLE_SERVICE_ACCOUNT_KEY",
            "the GCE/GKE metadata server's service account (workload identity)"),
    "azure": ("storage.accountKey or storage.sasToken, with storage.accountName",
              "AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY or "
              "AZURE_STORAGE_SAS_KEY; AZURE_STORAGE_CLIENT_ID, AZURE_STORAGE_CLIENT_SECRET and "
              "AZURE_STORAGE_TENANT_ID; AZURE_FEDERATED_TOKEN_FILE",
              "an Azure managed identity, asked at the metadata endpoint 169.254.169.254"),
}

#: obstore configuration keys (and their aliases) that already decide each fact.
_KEYS = {
    "credentials": ("access_key_id", "aws_access_key_id", "secret_access_key",
                    "aws_secret_access_key", "skip_signature", "aws_skip_signature",
                    "web_identity_token_file", "aws_web_identity_token_file"),
    "region": ("region", "aws_region", "default_region", "aws_default_region"),
    "endpoint": ("endpoint", "aws_endpoint", "endpoint_url", "aws_endpoint_url",
                 "aws_endpoint_url_s3"),
}
#: Environment variables that decide each fact before the shared files.
_ENV = {
    "credentials": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_WEB_IDENTITY_TOKEN_FILE"),
    "region": ("AWS_REGION", "AWS_DEFAULT_REGION"),
    "endpoint": ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"),
}
#: Profile settings through which botocore gets credentials other than static keys.
_BOTO3_ONLY = ("role_arn", "credential_process", "sso_session", "sso_start_url",
               "web_identity_token_file", "credential_source")

_SECRETS: set[str] = set()


class AwsFilesError(StorageError):
    """The AWS shared files cannot give what they name: a profile ``AWS_PROFILE`` names
    that is in neither file, half a key pair, a file that is not INI, a profile that needs
    boto3. About the machine's files, not the ``storage.*`` options."""


def profile_secrets() -> list[str]:
    """The secret values read from shared files in this process (to scrub from messages)."""
    return sorted(_SECRETS)


@dataclass
class AwsFiles:
    """The AWS shared files of an environment and the profile they are read for."""

    credentials_path: str
    config_path: str
    profile: str
    named_by: str | None  # the variable that named the profile, None for "default"
    values: dict[str, str] = field(default_factory=dict)
    found_in: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, environ: Mapping[str, str]) -> AwsFiles:
        named_by = next((v for v in ("AWS_DEFAULT_PROFILE", "AWS_PROFILE") if environ.get(v)),
                        None)
        return cls(_expand(environ.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials",
                           environ),
                   _expand(environ.get("AWS_CONFIG_FILE") or "~/.aws/config", environ),
                   environ[named_by] if named_by else "default", named_by)

    def read(self) -> AwsFiles:
        """The profile's settings: the config file's section, then the credentials file's
        over it."""
        config = _sections(self.config_path)
        wanted = ("profile default", "default") if self.profile == "default" else (
            f"profile {self.profile}",)
        for name in wanted:
            if name in config:
                self.values.update(config[name])
                self.found_in.append(self.config_path)
                break
        credentials = _sections(self.credentials_path)
        if self.profile in credentials:
            self.values.update(credentials[self.profile])
            self.found_in.append(self.credentials_path)
        if self.named_by and not self.found_in:
            held = sorted({n.removeprefix("profile ") for n in config} | set(credentials))
            raise AwsFilesError(
                f"{self.named_by}={self.profile!r}: no such profile in the AWS shared files "
                f"(no [{self.profile}] in {self.credentials_path}, no [profile "
                f"{self.profile}] in {self.config_path}); profiles there: "
                f"{', '.join(held) or 'none'}. Fix {self.named_by}, or unset it for the "
                "default profile")
        return self

    def where(self) -> str:
        return f"profile {self.profile!r} in {' and '.join(self.found_in)}"


def _expand(path: str, environ: Mapping[str, str]) -> str:
    """``~`` as the home of ``environ`` (``HOME``), else of this user."""
    if path == "~" or path.startswith("~/"):
        return (environ.get("HOME") or os.path.expanduser("~")) + path[1:]
    return os.path.expanduser(path)


def _sections(path: str) -> dict[str, dict[str, str]]:
    if not os.path.isfile(path):
        return {}
    parser = configparser.RawConfigParser(default_section="\0none")
    try:
        with open(path, encoding="utf-8") as f:
            parser.read_file(f, source=path)
    except (OSError, configparser.Error, UnicodeDecodeError) as e:
        # Never the offending line itself: it may hold a secret.
        lines = [n for n, _ in getattr(e, "errors", [])] or [getattr(e, "lineno", None)]
        at = ", ".join(f"line {n}" for n in lines if n)
        raise AwsFilesError(
            f"the AWS shared file {path} cannot be read ({type(e).__name__}"
            f"{' at ' + at if at else ''}): it is read as the AWS CLI reads it, INI sections "
            "of key = value") from None
    return {s: {k: v.strip() for k, v in parser.items(s)} for s in parser.sections()}


def _decided(fact: str, config: Mapping[str, Any], environ: Mapping[str, str]) -> bool:
    return any(config.get(k) not in (None, "") for k in _KEYS[fact]) or any(
        environ.get(v) for v in _ENV[fact])


def apply_aws_profile(config: MutableMapping[str, Any], client: MutableMapping[str, Any],
                      environ: Mapping[str, str] | None = None) -> tuple[Any, str | None]:
    """Fill in an S3 store's ``config`` (and ``client``: ``allow_http`` for an ``http://``
    ``endpoint_url``) from the AWS shared files, for each fact that neither ``config`` (the
    ``storage.*`` options) nor the environment decides. Returns ``(credential_provider,
    where)``: the boto3 provider a profile without static keys needs (else None), and
    where the credentials came from (e.g. ``profile 'default' in ~/.aws/credentials``),
    None when not from the files."""
    environ = os.environ if environ is None else environ
    files = AwsFiles.of(environ).read()
    values = files.values
    if not files.found_in:
        return None, None
    if not _decided("region", config, environ) and values.get("region"):
        config["region"] = values["region"]
    ignore = environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() == "true"
    endpoint = values.get("endpoint_url")
    if endpoint and not ignore and not _decided("endpoint", config, environ):
        config["endpoint"] = endpoint
        if endpoint.startswith("http://") and "allow_http" not in client \
                and not environ.get("AWS_ALLOW_HTTP"):
            client["allow_http"] = True
    if _decided("credentials", config, environ):
        return None, None
    key, secret = values.get("aws_access_key_id"), values.get("aws_secret_access_key")
    if key and secret:
        config["access_key_id"], config["secret_access_key"] = key, secret
        _SECRETS.add(secret)
        token = values.get("aws_session_token")
        if token:
            config["session_token"] = token
            _SECRETS.add(token)
        log.info("S3 credentials from the AWS %s", files.where())
        return None, files.where()
    if key or secret:
        given, missing = (("aws_access_key_id", "aws_secret_access_key") if key else
                          ("aws_secret_access_key", "aws_access_key_id"))
        raise AwsFilesError(f"AWS {files.where()} has {given} but no {missing}; give both "
                           "(`aws configure` writes both)")
    other = [k for k in _BOTO3_ONLY if values.get(k)]
    if not other:
        return None, None  # a profile of settings only (region, endpoint_url)
    return _boto3_provider(files, other), files.where()


def _boto3_provider(files: AwsFiles, how: list[str]) -> Any:
    """obstore's provider over a boto3 session of the profile: assumed roles, SSO and
    credential processes, as the AWS CLI resolves them."""
    try:
        import boto3
        import botocore.session
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError as e:
        raise AwsFilesError(
            f"AWS {files.where()} gets its credentials through {', '.join(how)}, which this "
            f"client resolves only with boto3 installed ({e}): pip install boto3, or give "
            "static keys (aws_access_key_id, aws_secret_access_key), the AWS_* variables or "
            "the storage.* options") from None
    try:
        core = botocore.session.Session()
        core.set_config_variable("config_file", files.config_path)  # the files read here
        core.set_config_variable("credentials_file", files.credentials_path)
        provider = Boto3CredentialProvider(
            boto3.Session(botocore_session=core, profile_name=files.profile))
    except Exception as e:  # noqa: BLE001 - botocore's errors, each one line for the operator
        raise AwsFilesError(f"AWS {files.where()}: boto3 found no credentials through "
                           f"{', '.join(how)}: {str(e).splitlines()[0]}") from None
    log.info("S3 credentials from the AWS %s, through boto3 (%s)", files.where(), ", ".join(how))
    return provider


def aws_files_looked_at(environ: Mapping[str, str] | None = None) -> str:
    """The shared files and the profile that were looked at, for the no-credentials error."""
    environ = os.environ if environ is None else environ
    files = AwsFiles.of(environ)
    named = (f"{files.named_by}={files.profile!r}" if files.named_by
             else "'default' (AWS_PROFILE unset)")

    def state(path: str) -> str:
        return "" if os.path.isfile(path) else " (no such file)"

    return (f"the AWS shared files {files.credentials_path}{state(files.credentials_path)} "
            f"(AWS_SHARED_CREDENTIALS_FILE) and {files.config_path}{state(files.config_path)} "
            f"(AWS_CONFIG_FILE), profile {named}")
