"""Azure Blob Storage, through azure-storage-blob."""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from azure.core.exceptions import (AzureError, ClientAuthenticationError, ResourceNotFoundError,
                                   ServiceRequestError)
from azure.storage.blob import BlobPrefix, BlobServiceClient

from .credentials import AzureCredential, azure_credential
from .locations import ObjectLocation
from .store import ObjectStore, StoredObject, StoreError

# Triton always talks to https://<account>.blob.core.windows.net; this names another blob service
# endpoint (an emulator such as azurite: http://127.0.0.1:10000/devstoreaccount1, or a sovereign cloud).
ENDPOINT_ENV = "TRITON_SERVE_AZURE_BLOB_ENDPOINT"


def _first_line(error: AzureError) -> str:
    """The service's reason without the request details the SDK appends on further lines."""
    return (error.message or str(error) or type(error).__name__).splitlines()[0]


class AzureStore(ObjectStore):
    """One blob container. The account is the credential's, else the location's (as in Triton)."""

    def __init__(self, where: ObjectLocation, credential: AzureCredential) -> None:
        self.container_name = where.bucket
        account = credential.account or where.account
        self.endpoint = os.environ.get(ENDPOINT_ENV) or f"https://{account}.blob.core.windows.net"
        key = {"account_name": account, "account_key": credential.key} if credential.key else None
        service = BlobServiceClient(self.endpoint, credential=key, retry_total=2, connection_timeout=10)
        self.container = service.get_container_client(where.bucket)

    @contextmanager
    def _translate(self, missing: str) -> Iterator[None]:
        """Turn the SDK's errors into StoreErrors; ``missing`` says what a 404 means for this call."""
        try:
            yield
        except ResourceNotFoundError:
            raise StoreError(missing) from None
        except ClientAuthenticationError as error:
            raise StoreError(f"access denied ({_first_line(error)}); check the credentials") from None
        except ServiceRequestError as error:
            raise StoreError(f"cannot reach {self.endpoint}: {_first_line(error)}") from None
        except AzureError as error:
            raise StoreError(_first_line(error)) from None

    def list_folders(self, prefix: str) -> list[str]:
        with self._translate(f"container '{self.container_name}' does not exist"):
            items = list(self.container.walk_blobs(name_starts_with=prefix or None, delimiter="/"))
        return [item.name[len(prefix):].rstrip("/") for item in items if isinstance(item, BlobPrefix)]

    def list_objects(self, prefix: str) -> list[StoredObject]:
        with self._translate(f"container '{self.container_name}' does not exist"):
            return [StoredObject(blob.name, int(blob.size), str(blob.etag))
                    for blob in self.container.list_blobs(name_starts_with=prefix or None)]

    def download(self, key: str, target: Path) -> None:
        with self._translate(f"blob '{key}' is gone"), open(target, "wb") as file:
            self.container.download_blob(key).readinto(file)


def open_store(where: ObjectLocation) -> AzureStore:
    """The store for an ``as://`` location, with its credential from the credential file or the environment."""
    return AzureStore(where, azure_credential(where.location))
