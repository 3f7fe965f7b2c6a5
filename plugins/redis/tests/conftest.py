"""Fixtures for the redis cache tests: a real redis-server on a free loopback port, and cached toy models.

redis-server comes from Debian's redis-server package (scripts/install.sh installs it); without it the tests skip.
"""
from __future__ import annotations

import datetime
import ipaddress
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from triton_serve.testing import RunningServer, ToyBackendsPlugin, free_port

# toy_count answers how many requests its model folder has executed: a cache hit does not count.
COUNTER = """
backend: "toy_count"
max_batch_size: 0
input { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }
output { name: "OUTPUT0" data_type: TYPE_INT64 dims: [ 1 ] }
response_cache { enable: true }
"""


class RedisServer:
    """A redis-server process with no persistence, in its own folder; ``start`` again after ``kill``."""

    def __init__(self, folder: Path, *arguments: str) -> None:
        self.folder = folder
        self.port = free_port()
        self.arguments = arguments
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def options(self) -> dict[str, str]:
        """``--cache-config redis,...`` for this server."""
        return {"host": "127.0.0.1", "port": str(self.port)}

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None
        arguments = [argument.format(port=self.port) for argument in self.arguments]
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.folder), *arguments],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"redis-server exited with status {self.process.returncode}"
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.02)
        raise RuntimeError(f"redis-server did not listen on port {self.port}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def client(self, **options: Any) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, **options)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """Start a redis-server (extra command-line ``arguments``, where ``{port}`` is its port); each is killed at
    teardown."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (Debian package redis-server; scripts/install.sh installs it)")
    started: list[RedisServer] = []

    def start(*arguments: str) -> RedisServer:
        folder = tmp_path / f"redis-{len(started)}"
        folder.mkdir()
        server = RedisServer(folder, *arguments)
        started.append(server)
        server.start()
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture
def cached_server(tserve: Callable[..., RunningServer], toy_plugin: ToyBackendsPlugin,
                  tmp_path: Path) -> Callable[..., RunningServer]:
    """A server of its own model repository (a model folder per server, so toy_count counts per server) that
    holds the cached model ``counter``, with ``cache_config=("redis", options)``."""
    count = 0

    def start(options: dict[str, str], **server_options: Any) -> RunningServer:
        nonlocal count
        count += 1
        model = tmp_path / f"models-{count}" / "counter"
        (model / "1").mkdir(parents=True)
        (model / "config.pbtxt").write_text(COUNTER)
        return tserve(model.parent, extra_plugins=[("toy", toy_plugin)], cache_config=("redis", options),
                      **server_options)

    return start



def _certificate(folder: Path, name: str, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
                 **extensions: x509.ExtensionType) -> tuple[x509.Name, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    issuer_name, issuer_key = issuer or (subject, key)
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(hours=1)))
    for extension in extensions.values():
        builder = builder.add_extension(extension, critical=False)
    certificate = builder.sign(issuer_key, hashes.SHA256())
    (folder / f"{name}.crt").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (folder / f"{name}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                           serialization.PrivateFormat.PKCS8,
                                                           serialization.NoEncryption()))
    return subject, key


@pytest.fixture
def tls_files(tmp_path: Path) -> Path:
    """A folder with ca.crt, and server.crt/.key (for 127.0.0.1) and client.crt/.key signed by that CA."""
    folder = tmp_path / "tls"
    folder.mkdir()
    ca = _certificate(folder, "ca", None, ca=x509.BasicConstraints(ca=True, path_length=None))
    _certificate(folder, "server", ca, names=x509.SubjectAlternativeName([x509.IPAddress(
        ipaddress.ip_address("127.0.0.1"))]))
    _certificate(folder, "client", ca)
    return folder
