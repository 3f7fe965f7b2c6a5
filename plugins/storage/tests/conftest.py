"""Fixtures for the cloud repository tests: S3, GCS and Azure emulators on loopback ports, and buckets in them.

S3 is moto's server (wrapped to record every request), GCS is gcp-storage-emulator, Azure is azurite
(installed by scripts/install.sh into <repo>/.npm-tools). Each emulator starts once per session, when a
test first needs it; each test gets a fresh bucket and the environment that points the server at it.
"""
from __future__ import annotations

import asyncio
import logging
import re
import shutil
import socket
import subprocess
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest
import tritonclient.http as http
from azure.storage.blob import BlobServiceClient
from google.cloud import storage
from moto.server import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import make_server

from triton_serve.plugin import Server, ServerError, ServerOptions
from triton_serve.testing import ToyBackendsPlugin, free_port

REPO_ROOT = Path(__file__).resolve().parents[3]
AZURITE = REPO_ROOT / ".npm-tools" / "node_modules" / ".bin" / "azurite-blob"
# azurite's fixed development account (published in Azure's emulator documentation).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
CLOUD_ENV = ("TRITON_CLOUD_CREDENTIAL_PATH", "AWS_PROFILE", "AWS_SESSION_TOKEN", "GOOGLE_APPLICATION_CREDENTIALS",
             "STORAGE_EMULATOR_HOST", "AZURE_STORAGE_ACCOUNT", "AZURE_STORAGE_KEY", "TRITON_SERVE_AZURE_BLOB_ENDPOINT",
             "TRITON_AWS_MOUNT_DIRECTORY", "TRITON_GCS_MOUNT_DIRECTORY", "TRITON_AZURE_MOUNT_DIRECTORY")


def _wait_listening(port: int, what: str, process: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with status {process.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on port {port}")


# ---- buckets --------------------------------------------------------------------------------------

class Bucket(ABC):
    """A fresh bucket in an emulator; the repository under test is its "models/" prefix."""

    location: str

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Create or overwrite one object."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete one object."""

    def upload(self, files: dict[str, bytes], prefix: str = "models/") -> None:
        for relative, data in files.items():
            self.put(prefix + relative, data)

    def upload_folder(self, folder: Path, prefix: str) -> None:
        """Every file under ``folder`` (bytecode caches left out) to keys under ``prefix``."""
        self.upload({path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*")
                     if path.is_file() and "__pycache__" not in path.parts}, prefix)


class S3Bucket(Bucket):
    def __init__(self, client: Any, endpoint: str) -> None:
        self.client, self.name = client, f"bucket-{uuid.uuid4().hex[:12]}"
        client.create_bucket(Bucket=self.name)
        self.location = f"s3://{endpoint.removeprefix('http://')}/{self.name}/models"

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.name, Key=key, Body=data)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.name, Key=key)


class GCSBucket(Bucket):
    def __init__(self, client: storage.Client) -> None:
        self.bucket = client.create_bucket(f"bucket-{uuid.uuid4().hex[:12]}")
        self.location = f"gs://{self.bucket.name}/models"

    def put(self, key: str, data: bytes) -> None:
        self.bucket.blob(key).upload_from_string(data)

    def delete(self, key: str) -> None:
        self.bucket.blob(key).delete()


class AzureContainer(Bucket):
    def __init__(self, service: BlobServiceClient) -> None:
        name = f"container-{uuid.uuid4().hex[:12]}"
        self.container = service.create_container(name)
        self.location = f"as://{AZURITE_ACCOUNT}/{name}/models"

    def put(self, key: str, data: bytes) -> None:
        self.container.upload_blob(key, data, overwrite=True)

    def delete(self, key: str) -> None:
        self.container.delete_blob(key)


# ---- emulators ------------------------------------------------------------------------------------

class RequestLog:
    """WSGI middleware that records each request's method, path and signing credential
    ("<key id>/<date>/<region>/s3/aws4_request") before passing it on."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.requests: list[tuple[str, str, str]] = []

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        found = re.search(r"Credential=([^,\s]+)", environ.get("HTTP_AUTHORIZATION", ""))
        self.requests.append((environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), found[1] if found else ""))
        return self.app(environ, start_response)

    def gets(self, path_prefix: str, since: int = 0) -> list[str]:
        """Paths of the GET requests (from the ``since``-th on) for keys under ``path_prefix``
        (listings go to the bucket's own path, so they are not counted)."""
        return [path for method, path, _ in self.requests[since:] if method == "GET" and path.startswith(path_prefix)]

    def credentials(self, path_prefix: str, since: int = 0) -> set[str]:
        """The key ids and regions that signed requests (from the ``since``-th on) under ``path_prefix``,
        as "<key id>/<region>"."""
        return {"/".join(credential.split("/")[0:3:2]) for _, path, credential in self.requests[since:]
                if path.startswith(path_prefix)}


class Emulator(ABC):
    """One emulated cloud: makes buckets and points the server's environment at itself."""

    @abstractmethod
    def new_bucket(self) -> Bucket: ...

    @abstractmethod
    def configure(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Set the environment a server needs to reach this emulator with valid credentials."""


class S3Emulator(Emulator):
    def __init__(self) -> None:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self.log = RequestLog(DomainDispatcherApplication(create_backend_app))
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.server = make_server("127.0.0.1", self.port, self.log, threaded=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        _wait_listening(self.port, "moto")
        self.client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                                   aws_access_key_id="testing", aws_secret_access_key="testing")

    def new_bucket(self) -> S3Bucket:
        return S3Bucket(self.client, self.endpoint)

    def configure(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")

    def stop(self) -> None:
        self.server.shutdown()


class GCSEmulator(Emulator):
    def __init__(self) -> None:
        from gcp_storage_emulator.server import create_server
        self.port = free_port()
        self.server = create_server("127.0.0.1", self.port, in_memory=True)
        self.server.start()
        self.host = f"http://127.0.0.1:{self.port}"
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("STORAGE_EMULATOR_HOST", self.host)
            self.client = storage.Client(project="test")

    def new_bucket(self) -> GCSBucket:
        return GCSBucket(self.client)

    def configure(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", self.host)

    def stop(self) -> None:
        self.server.stop()


class AzureEmulator(Emulator):
    def __init__(self, command: str, workdir: Path) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [command, "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--inMemoryPersistence",
             "--skipApiVersionCheck", "--silent", "--loose", "--disableTelemetry"],
            cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        _wait_listening(self.port, "azurite", self.process)
        self.endpoint = f"http://127.0.0.1:{self.port}/{AZURITE_ACCOUNT}"
        self.service = BlobServiceClient(self.endpoint, credential={"account_name": AZURITE_ACCOUNT,
                                                                    "account_key": AZURITE_KEY})

    def new_bucket(self) -> AzureContainer:
        return AzureContainer(self.service)

    def configure(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", AZURITE_ACCOUNT)
        monkeypatch.setenv("AZURE_STORAGE_KEY", AZURITE_KEY)
        monkeypatch.setenv("TRITON_SERVE_AZURE_BLOB_ENDPOINT", self.endpoint)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="session")
def s3_emulator() -> Iterator[S3Emulator]:
    emulator = S3Emulator()
    yield emulator
    emulator.stop()


@pytest.fixture(scope="session")
def gs_emulator() -> Iterator[GCSEmulator]:
    emulator = GCSEmulator()
    yield emulator
    emulator.stop()


@pytest.fixture(scope="session")
def as_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzureEmulator]:
    command = str(AZURITE) if AZURITE.exists() else shutil.which("azurite-blob")
    if command is None:
        pytest.skip("azurite is not installed (scripts/install.sh installs it into .npm-tools)")
    emulator = AzureEmulator(command, tmp_path_factory.mktemp("azurite"))
    yield emulator
    emulator.stop()


@pytest.fixture
def cloud_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No cloud settings from the developer's environment; models are cached under ``tmp_path/cache``
    (returned) so tests can look at what was downloaded."""
    for name in CLOUD_ENV:
        monkeypatch.delenv(name, raising=False)
    cache = tmp_path / "cache"
    monkeypatch.setenv("TRITON_SERVE_MODEL_CACHE", str(cache))
    return cache


# ---- models and requests ----------------------------------------------------------------------------

class StorageKit:
    """Model files and requests the tests reach through the ``kit`` fixture."""

    @staticmethod
    def labelled_model(versions: tuple[int, ...] = (1,), policy: str = "latest { num_versions: 1 }",
                       labels: str = "cat\ndog\nbird\n") -> dict[str, bytes]:
        """A toy_identity model whose OUTPUT0 carries labels (labels.txt): classifying [0.1, 0.9, 0.3]
        answers with label 1. Each version folder holds a model file naming its version."""
        config = f"""
backend: "toy_identity"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 3 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 3 ] label_filename: "labels.txt" }} ]
version_policy {{ {policy} }}
"""
        files = {"config.pbtxt": config.encode(), "labels.txt": labels.encode()}
        for version in versions:
            files[f"{version}/toy_identity.toy"] = f"# version {version}\n".encode()
        return files

    @staticmethod
    def add_sub_model() -> dict[str, bytes]:
        config = """
backend: "toy_add_sub"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
"""
        return {"config.pbtxt": config.encode(), "1/toy_add_sub.toy": b"# add_sub\n"}

    @staticmethod
    def start_error(location: str) -> str:
        """The error a server with this one repository fails to start with."""
        server = Server(ServerOptions(model_repositories=[location], allow_http=False, allow_grpc=False,
                                      allow_metrics=False))
        with pytest.raises(ServerError) as raised:
            asyncio.run(server.start())
        return raised.value.message

    @staticmethod
    def write(root: Path, files: dict[str, bytes]) -> Path:
        """Write ``files`` (paths relative to ``root``) to disk; returns ``root``."""
        for relative, data in files.items():
            path = root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        return root

    @staticmethod
    def top_label(client: http.InferenceServerClient, model: str) -> str:
        """The label of the largest OUTPUT0 value for input [0.1, 0.9, 0.3] (Triton's classification)."""
        tensor = http.InferInput("INPUT0", [3], "FP32")
        tensor.set_data_from_numpy(np.array([0.1, 0.9, 0.3], np.float32))
        result = client.infer(model, [tensor], outputs=[http.InferRequestedOutput("OUTPUT0", class_count=1)])
        top = result.as_numpy("OUTPUT0")[0]
        return (top.decode() if isinstance(top, bytes) else top).split(":")[2]

    @staticmethod
    def add_sub(client: http.InferenceServerClient, model: str) -> list[int]:
        """OUTPUT0 of the add_sub model for [1, 2, 3, 4] + [10, 20, 30, 40]."""
        inputs = []
        for name, values in (("INPUT0", [1, 2, 3, 4]), ("INPUT1", [10, 20, 30, 40])):
            tensor = http.InferInput(name, [4], "INT32")
            tensor.set_data_from_numpy(np.array(values, np.int32))
            inputs.append(tensor)
        return client.infer(model, inputs).as_numpy("OUTPUT0").tolist()


@pytest.fixture
def kit() -> type[StorageKit]:
    return StorageKit


@pytest.fixture
def toy() -> list[tuple[str, ToyBackendsPlugin]]:
    """``extra_plugins`` for a server with the core's toy backends."""
    return [("toy", ToyBackendsPlugin())]
