"""Location parsing, credential look-up and the cache sync, without an emulator."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from triton_serve.plugin import Server, ServerError, ServerOptions
from triton_serve_storage.cache_dir import CacheDirectory
from triton_serve_storage.credentials import (AzureCredential, GCSCredential, S3Credential, azure_credential,
                                              gcs_credential, s3_credential)
from triton_serve_storage.locations import parse_azure, parse_gcs, parse_s3
from triton_serve_storage.plugin import tserve_repository_source
from triton_serve_storage.store import ObjectStore, StoredObject, StoreError
from triton_serve_storage.sync import ModelCache


@pytest.mark.parametrize("location, bucket, prefix, endpoint, name", [
    ("s3://bucket/path/to/models", "bucket", "path/to/models/", "", "models"),
    ("s3://bucket", "bucket", "", "", "bucket"),
    ("s3://bucket//models///", "bucket", "models/", "", "models"),
    ("s3://127.0.0.1:9000/bucket/models", "bucket", "models/", "http://127.0.0.1:9000", "models"),
    ("s3://http://minio.local:9000/bucket", "bucket", "", "http://minio.local:9000", "bucket"),
    ("s3://https://minio.local:443/bucket/a/b", "bucket", "a/b/", "https://minio.local:443", "b"),
])
def test_s3_locations(location: str, bucket: str, prefix: str, endpoint: str, name: str) -> None:
    parsed = parse_s3(location)
    assert (parsed.bucket, parsed.prefix, parsed.endpoint, parsed.name) == (bucket, prefix, endpoint, name)


def test_gcs_and_azure_locations() -> None:
    gcs = parse_gcs("gs://bucket/path/models")
    assert (gcs.bucket, gcs.prefix, gcs.name) == ("bucket", "path/models/", "models")
    azure = parse_azure("as://account/container/path/models")
    assert (azure.account, azure.bucket, azure.prefix, azure.name) == ("account", "container", "path/models/", "models")
    full = parse_azure("as://account.blob.core.windows.net/container?sv=1")
    assert (full.account, full.bucket, full.prefix, full.name) == ("account", "container", "", "container")


@pytest.mark.parametrize("location, message", [
    ("s3://", "No bucket name found in path: s3://"),
    ("s3://minio.local:9000", "No bucket name found in path: s3://minio.local:9000"),
    ("s3://https://minio.local/bucket", "model repository 's3://https://minio.local/bucket': an https:// endpoint "
                                        "needs a port"),
    ("gs:///", "No bucket name found in path: gs:///"),
    ("as://account", "Invalid azure storage path: as://account"),
])
def test_malformed_locations_stop_the_server_from_starting(location: str, message: str) -> None:
    with pytest.raises(ServerError) as raised:
        Server(ServerOptions(model_repositories=[location], allow_http=False, allow_grpc=False, allow_metrics=False))
    assert raised.value.message.startswith(message), raised.value.message


def test_a_missing_sdk_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 now raises ImportError
    monkeypatch.delitem(sys.modules, "triton_serve_storage.s3", raising=False)
    with pytest.raises(ServerError, match="model repository 's3://bucket/models' needs boto3 .*: "
                                          "pip install 'triton-serve-storage\\[s3\\]'"):
        tserve_repository_source("s3://bucket/models")


def test_other_locations_are_left_to_other_plugins() -> None:
    assert tserve_repository_source("/srv/models") is None
    assert tserve_repository_source("file:///srv/models") is None
    assert tserve_repository_source("hdfs://cluster/models") is None


@pytest.fixture
def credential_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cloud_credential.json"
    path.write_text(json.dumps({
        "gs": {"": "/keys/default.json", "gs://bucket-2": "/keys/second.json"},
        "s3": {"s3://bucket": {"key_id": "A", "secret_key": "B", "profile": "p"}},
        "as": {"": {"account_str": "acct", "account_key": "k"}, "as://other/c": {"account_str": "", "account_key": ""}},
    }))
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(path))
    return path


def test_credential_file_entries_by_longest_matching_name(credential_file: Path) -> None:
    assert gcs_credential("gs://bucket-2/models") == GCSCredential("/keys/second.json")
    assert gcs_credential("gs://bucket-3/models") == GCSCredential("/keys/default.json")
    assert s3_credential("s3://bucket/models") == S3Credential(key_id="A", secret_key="B", profile="p")
    assert azure_credential("as://acct/container") == AzureCredential("acct", "k")
    assert azure_credential("as://other/c/models") == AzureCredential("", "")


def test_credentials_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_CLOUD_CREDENTIAL_PATH", raising=False)
    for name, value in {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_DEFAULT_REGION": "r",
                        "AWS_SESSION_TOKEN": "t", "AWS_PROFILE": "p", "GOOGLE_APPLICATION_CREDENTIALS": "/g.json",
                        "AZURE_STORAGE_ACCOUNT": "acct", "AZURE_STORAGE_KEY": "key"}.items():
        monkeypatch.setenv(name, value)
    assert s3_credential("s3://b") == S3Credential("id", "secret", "r", "t", "p")
    assert gcs_credential("gs://b") == GCSCredential("/g.json")
    assert azure_credential("as://a/c") == AzureCredential("acct", "key")


class DictStore(ObjectStore):
    """An in-memory bucket that counts downloads."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.downloads: list[str] = []

    def list_folders(self, prefix: str) -> list[str]:
        raise NotImplementedError

    def list_objects(self, prefix: str) -> list[StoredObject]:
        return [StoredObject(key, len(data), str(hash(data))) for key, data in sorted(self.objects.items())
                if key.startswith(prefix)]

    def download(self, key: str, target: Path) -> None:
        self.downloads.append(key)
        target.write_bytes(self.objects[key])


def sync(cache: ModelCache, store: DictStore, versions: set[int] | None) -> Path:
    return cache.sync(store, "m", "models/m/", store.list_objects("models/m/"), versions)


def test_sync_repairs_local_changes_and_keeps_files_it_did_not_write(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_SERVE_MODEL_CACHE", str(tmp_path))
    store = DictStore({"models/m/config.pbtxt": b"config", "models/m/1/model.py": b"one", "models/m/2/": b"",
                       "models/m/3/model.py": b"three"})
    cache = ModelCache(CacheDirectory("s3", "s3://b/models", "models"))
    model_dir = sync(cache, store, {2})
    assert sorted(p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*")) == ["2", "config.pbtxt"]
    (model_dir / "config.pbtxt").write_bytes(b"edited locally")
    (model_dir / "2" / "__pycache__").mkdir()
    (model_dir / "2" / "__pycache__" / "model.pyc").write_bytes(b"")
    store.downloads.clear()
    sync(cache, store, {2, 3})
    assert sorted(store.downloads) == ["models/m/3/model.py", "models/m/config.pbtxt"]
    assert (model_dir / "config.pbtxt").read_bytes() == b"config"
    assert (model_dir / "2" / "__pycache__" / "model.pyc").exists()
    store.downloads.clear()
    sync(cache, store, {2, 3})
    assert store.downloads == []


def test_sync_refuses_keys_that_leave_the_model_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_SERVE_MODEL_CACHE", str(tmp_path))
    store = DictStore({"models/m/config.pbtxt": b"config", "models/m/../../escape.txt": b"x"})
    with pytest.raises(StoreError, match="object 'models/m/../../escape.txt' has a key that is not a plain"):
        sync(ModelCache(CacheDirectory("s3", "s3://b/models", "models")), store, None)
    assert not list(tmp_path.rglob("escape.txt"))
