"""Google Cloud Storage, through google-cloud-storage (which honours ``STORAGE_EMULATOR_HOST``)."""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import google.auth
from google.api_core import exceptions as api_errors
from google.api_core.retry import Retry
from google.auth.exceptions import DefaultCredentialsError, GoogleAuthError
from google.cloud import storage
from requests.exceptions import RequestException

from .credentials import GCSCredential, gcs_credential
from .locations import ObjectLocation
from .store import ObjectStore, StoredObject, StoreError

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
_RETRY = Retry(timeout=30)  # the SDK's default retries transient errors for 120 s
_TIMEOUT = 60


def _client(credential: GCSCredential) -> storage.Client:
    """Triton's order: the credential file, else the environment's default credentials, else anonymous.
    Against an emulator (``STORAGE_EMULATOR_HOST``) the SDK connects anonymously."""
    if os.environ.get(EMULATOR_ENV):
        return storage.Client(project=None)
    if credential.path:
        try:
            found, _project = google.auth.load_credentials_from_file(credential.path)
        except DefaultCredentialsError as error:
            raise StoreError(f"cannot use the GCS credential file '{credential.path}': {error}") from None
        return storage.Client(project=None, credentials=found)
    try:
        return storage.Client(project=None)
    except DefaultCredentialsError:
        return storage.Client.create_anonymous_client()


class GCSStore(ObjectStore):
    """One GCS bucket."""

    def __init__(self, where: ObjectLocation, credential: GCSCredential) -> None:
        self.bucket_name = where.bucket
        self.client = _client(credential)
        self.bucket = self.client.bucket(where.bucket)

    @contextmanager
    def _translate(self, missing: str) -> Iterator[None]:
        """Turn the SDK's errors into StoreErrors; ``missing`` says what a 404 means for this call."""
        try:
            yield
        except api_errors.NotFound:
            raise StoreError(missing) from None
        except (api_errors.Forbidden, api_errors.Unauthorized) as error:
            raise StoreError(f"access denied ({error.message}); check the credentials") from None
        except api_errors.GoogleAPIError as error:
            raise StoreError(str(error)) from None
        except GoogleAuthError as error:
            raise StoreError(f"cannot authenticate: {error}") from None
        except RequestException as error:
            raise StoreError(f"cannot reach Google Cloud Storage: {error}") from None

    def list_folders(self, prefix: str) -> list[str]:
        with self._translate(f"bucket '{self.bucket_name}' does not exist"):
            blobs = self.client.list_blobs(self.bucket_name, prefix=prefix, delimiter="/", retry=_RETRY,
                                           timeout=_TIMEOUT)
            folders = [folder for page in blobs.pages for folder in page.prefixes]
        return [folder[len(prefix):].rstrip("/") for folder in folders]

    def list_objects(self, prefix: str) -> list[StoredObject]:
        with self._translate(f"bucket '{self.bucket_name}' does not exist"):
            return [StoredObject(blob.name, int(blob.size or 0), blob.md5_hash or str(blob.generation))
                    for blob in self.client.list_blobs(self.bucket_name, prefix=prefix, retry=_RETRY,
                                                       timeout=_TIMEOUT)]

    def download(self, key: str, target: Path) -> None:
        with self._translate(f"object '{key}' is gone"):
            self.bucket.blob(key).download_to_filename(str(target), retry=_RETRY, timeout=_TIMEOUT)


def open_store(where: ObjectLocation) -> GCSStore:
    """The store for a ``gs://`` location, with its credential from the credential file or the environment."""
    return GCSStore(where, gcs_credential(where.location))
