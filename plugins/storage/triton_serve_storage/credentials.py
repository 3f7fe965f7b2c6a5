"""Cloud credentials, as Triton finds them: the ``TRITON_CLOUD_CREDENTIAL_PATH`` file, else the environment."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from triton_serve.plugin import ServerError

CREDENTIAL_PATH_ENV = "TRITON_CLOUD_CREDENTIAL_PATH"


@dataclass(frozen=True)
class S3Credential:
    """Keys (with region and session token), else a profile name, else the SDK's default chain."""

    key_id: str = ""
    secret_key: str = ""
    region: str = ""
    session_token: str = ""
    profile: str = ""


@dataclass(frozen=True)
class GCSCredential:
    """A credential JSON file (authorized user or service account); empty: the default chain, else anonymous."""

    path: str = ""


@dataclass(frozen=True)
class AzureCredential:
    """A storage account name (overrides the location's) and its shared key; no key: anonymous."""

    account: str = ""
    key: str = ""


def _file_entry(scheme: str, location: str) -> Any:
    """The credential file's entry for ``location`` (the longest name that starts it), or None when
    ``TRITON_CLOUD_CREDENTIAL_PATH`` is unset."""
    path = os.environ.get(CREDENTIAL_PATH_ENV)
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as file:
            document = json.load(file)
    except (OSError, ValueError) as error:
        raise ServerError(f"cannot read the {CREDENTIAL_PATH_ENV} file '{path}': {error}") from None
    entries = document.get(scheme, {}) if isinstance(document, dict) else {}
    if not isinstance(entries, dict):
        raise ServerError(f"the {CREDENTIAL_PATH_ENV} file '{path}': \"{scheme}\" must be an object")
    matching = [name for name in entries if location.startswith(name)]
    if not matching:
        raise ServerError(f"the {CREDENTIAL_PATH_ENV} file '{path}' has no \"{scheme}\" credential whose "
                          f"name starts model repository '{location}'")
    return entries[max(matching, key=len)]


def _fields(entry: Any, scheme: str, keys: dict[str, str]) -> dict[str, str]:
    if not isinstance(entry, dict):
        raise ServerError(f"the {CREDENTIAL_PATH_ENV} file: each \"{scheme}\" credential must be an object")
    return {field: str(entry.get(key, "")) for key, field in keys.items()}


def s3_credential(location: str) -> S3Credential:
    """From the credential file's "s3" section, else AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    AWS_DEFAULT_REGION, AWS_SESSION_TOKEN and AWS_PROFILE."""
    entry = _file_entry("s3", location)
    if entry is None:
        env = os.environ.get
        return S3Credential(env("AWS_ACCESS_KEY_ID", ""), env("AWS_SECRET_ACCESS_KEY", ""),
                            env("AWS_DEFAULT_REGION", ""), env("AWS_SESSION_TOKEN", ""), env("AWS_PROFILE", ""))
    names = ("key_id", "secret_key", "region", "session_token", "profile")  # the same in the file and here
    return S3Credential(**_fields(entry, "s3", {name: name for name in names}))


def gcs_credential(location: str) -> GCSCredential:
    """From the credential file's "gs" section (a path per name), else GOOGLE_APPLICATION_CREDENTIALS."""
    entry = _file_entry("gs", location)
    if entry is None:
        return GCSCredential(os.environ.get("GOOGLE_APPLICATION_CREDENTIALS", ""))
    if not isinstance(entry, str):
        raise ServerError(f"the {CREDENTIAL_PATH_ENV} file: each \"gs\" credential must be a file path")
    return GCSCredential(entry)


def azure_credential(location: str) -> AzureCredential:
    """From the credential file's "as" section, else AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY."""
    entry = _file_entry("as", location)
    if entry is None:
        return AzureCredential(os.environ.get("AZURE_STORAGE_ACCOUNT", ""), os.environ.get("AZURE_STORAGE_KEY", ""))
    return AzureCredential(**_fields(entry, "as", {"account_str": "account", "account_key": "key"}))
