"""Amazon S3 and S3-compatible servers, through boto3."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

from .credentials import S3Credential, s3_credential
from .locations import ObjectLocation
from .store import ObjectStore, StoredObject, StoreError

_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "403"}


def _session(credential: S3Credential) -> boto3.Session:
    """Keys win over a profile, which wins over the SDK's default chain (Triton's order)."""
    region = credential.region or None
    if credential.key_id and credential.secret_key:
        return boto3.Session(aws_access_key_id=credential.key_id, aws_secret_access_key=credential.secret_key,
                             aws_session_token=credential.session_token or None, region_name=region)
    if credential.profile:
        return boto3.Session(profile_name=credential.profile, region_name=region)
    return boto3.Session(region_name=region)


class S3Store(ObjectStore):
    """One S3 bucket, on AWS or at the location's ``host:port`` endpoint (path-style addressing there)."""

    def __init__(self, where: ObjectLocation, credential: S3Credential) -> None:
        self.bucket = where.bucket
        self.endpoint = where.endpoint
        config = Config(connect_timeout=10, read_timeout=60, retries={"mode": "standard", "max_attempts": 3},
                        s3={"addressing_style": "path"} if where.endpoint else None)
        with self._translate():
            self.client = _session(credential).client("s3", endpoint_url=where.endpoint or None, config=config)

    @contextmanager
    def _translate(self) -> Iterator[None]:
        """Turn the SDK's errors into StoreErrors that say what to check."""
        try:
            yield
        except ClientError as error:
            details = error.response.get("Error", {})
            code, message = str(details.get("Code", "")), str(details.get("Message", ""))
            if code == "NoSuchBucket":
                raise StoreError(f"bucket '{self.bucket}' does not exist") from None
            if code in _DENIED:
                raise StoreError(f"access denied ({code}: {message}); check the credentials") from None
            raise StoreError(f"{code}: {message}" if message else str(error)) from None
        except NoCredentialsError:
            raise StoreError("no AWS credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                             "AWS_PROFILE, or TRITON_CLOUD_CREDENTIAL_PATH)") from None
        except EndpointConnectionError as error:
            raise StoreError(f"cannot reach the S3 endpoint: {error}") from None
        except BotoCoreError as error:
            raise StoreError(str(error)) from None

    def _pages(self, **query: str) -> Iterator[dict[str, Any]]:
        with self._translate():
            yield from self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, **query)

    def list_folders(self, prefix: str) -> list[str]:
        return [entry["Prefix"][len(prefix):].rstrip("/")
                for page in self._pages(Prefix=prefix, Delimiter="/") for entry in page.get("CommonPrefixes", [])]

    def list_objects(self, prefix: str) -> list[StoredObject]:
        return [StoredObject(entry["Key"], int(entry["Size"]), str(entry.get("ETag", "")))
                for page in self._pages(Prefix=prefix) for entry in page.get("Contents", [])]

    def download(self, key: str, target: Path) -> None:
        with self._translate():
            self.client.download_file(self.bucket, key, str(target))


def open_store(where: ObjectLocation) -> S3Store:
    """The store for an ``s3://`` location, with its credential from the credential file or the environment."""
    return S3Store(where, s3_credential(where.location))
