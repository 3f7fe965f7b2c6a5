"""The gRPC transport: TLS and mutual TLS, compression, message limits, health checks, flags and binding."""
from __future__ import annotations

import asyncio
import datetime
import ipaddress
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from tritonclient.utils import InferenceServerException

from triton_serve._engine.cli import build_parser, options_from_args
from triton_serve._engine.errors import ServerError
from triton_serve._engine.frontend.grpc.server import GrpcFrontend, GrpcOptions, server_credentials
from triton_serve._engine.protos import health_pb2, health_pb2_grpc

IDENTITY = """
backend: "toy_identity"
max_batch_size: 0
input { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }
output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }
"""


def _fp32_input(data: np.ndarray) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", [data.size], "FP32")
    tensor.set_data_from_numpy(data)
    return [tensor]


# ---- TLS -------------------------------------------------------------------------------------

def _write_pem(path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> tuple[str, str]:
    key_path, cert_path = path.with_suffix(".key"), path.with_suffix(".crt")
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(key_path), str(cert_path)


KeyAndCert = tuple[ec.EllipticCurvePrivateKey, x509.Certificate]


def _issue(subject: str, issuer_key: ec.EllipticCurvePrivateKey | None = None,
           issuer: x509.Name | None = None, server: bool = False) -> KeyAndCert:
    """A certificate for ``subject``, self-signed when no issuer is given (a CA)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(name).issuer_name(issuer or name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return key, builder.sign(issuer_key or key, hashes.SHA256())


@pytest.fixture
def certificates(tmp_path: Path) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""
    ca_key, ca_cert = _issue("test-ca")
    _, ca_path = _write_pem(tmp_path / "ca", ca_key, ca_cert)
    server_key, server_cert = _write_pem(tmp_path / "server", *_issue("server", ca_key, ca_cert.subject, server=True))
    client_key, client_cert = _write_pem(tmp_path / "client", *_issue("client", ca_key, ca_cert.subject))
    return {"ca": ca_path, "server_key": server_key, "server_cert": server_cert,
            "client_key": client_key, "client_cert": client_cert}


def test_tls(add_model, toy_server, certificates) -> None:  # type: ignore[no-untyped-def]
    add_model("identity", IDENTITY)
    server = toy_server(grpc_options=GrpcOptions(use_ssl=True, server_cert=certificates["server_cert"],
                                                 server_key=certificates["server_key"]))
    data = np.arange(4, dtype=np.float32)
    with grpcclient.InferenceServerClient(server.grpc_url, ssl=True, root_certificates=certificates["ca"]) as client:
        assert client.is_server_ready()
        assert client.infer("identity", _fp32_input(data)).as_numpy("OUTPUT0").tolist() == data.tolist()
    with grpcclient.InferenceServerClient(server.grpc_url) as plaintext:
        with pytest.raises(InferenceServerException) as raised:
            plaintext.is_server_live()
        assert raised.value.status() == "StatusCode.UNAVAILABLE"


def test_mutual_tls(add_model, toy_server, certificates) -> None:  # type: ignore[no-untyped-def]
    add_model("identity", IDENTITY)
    server = toy_server(grpc_options=GrpcOptions(use_ssl_mutual=True, server_cert=certificates["server_cert"],
                                                 server_key=certificates["server_key"], root_cert=certificates["ca"]))
    with grpcclient.InferenceServerClient(server.grpc_url, ssl=True, root_certificates=certificates["ca"],
                                          private_key=certificates["client_key"],
                                          certificate_chain=certificates["client_cert"]) as client:
        assert client.is_server_ready()
        data = np.arange(3, dtype=np.float32)
        assert client.infer("identity", _fp32_input(data)).as_numpy("OUTPUT0").tolist() == data.tolist()
    with grpcclient.InferenceServerClient(server.grpc_url, ssl=True, root_certificates=certificates["ca"]) as anonymous:
        with pytest.raises(InferenceServerException) as raised:
            anonymous.is_server_live()
        assert raised.value.status() == "StatusCode.UNAVAILABLE"


def test_tls_files_must_be_readable(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match="failed to read --grpc-server-key file"):
        server_credentials(GrpcOptions(use_ssl=True, server_key=str(tmp_path / "none.key"), server_cert="x"))
    with pytest.raises(ServerError, match="--grpc-server-cert is required"):
        server_credentials(GrpcOptions(use_ssl=True, server_key=__file__))


# ---- compression and message size ------------------------------------------------------------

class ByteCountingProxy:
    """A TCP relay in front of the server that counts the bytes each way (to see compression at work)."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.to_server = 0
        self.to_client = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._relay, args=(downstream, upstream, True), daemon=True).start()
            threading.Thread(target=self._relay, args=(upstream, downstream, False), daemon=True).start()

    def _relay(self, source: socket.socket, sink: socket.socket, to_server: bool) -> None:
        try:
            while data := source.recv(1 << 16):
                if to_server:
                    self.to_server += len(data)
                else:
                    self.to_client += len(data)
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                end.close()

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize(("client_algorithm", "server_level"),
                         [(None, "none"), ("gzip", "low"), ("deflate", "none"), (None, "high")])
def test_request_and_response_compression(add_model, toy_server, client_algorithm: str | None,
                                          server_level: str) -> None:  # type: ignore[no-untyped-def]
    add_model("identity", IDENTITY)
    server = toy_server(grpc_options=GrpcOptions(infer_response_compression_level=server_level))
    proxy = ByteCountingProxy(server.grpc_url)
    data = np.zeros(1 << 20, dtype=np.float32)  # 4 MB that compresses to almost nothing
    try:
        with grpcclient.InferenceServerClient(proxy.url) as client:
            result = client.infer("identity", _fp32_input(data), compression_algorithm=client_algorithm)
            assert np.array_equal(result.as_numpy("OUTPUT0"), data)
    finally:
        proxy.close()
    assert (proxy.to_server < data.nbytes // 10) == (client_algorithm is not None)
    assert (proxy.to_client < data.nbytes // 10) == (server_level != "none")


def test_oversized_message_is_refused(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("identity", IDENTITY)
    server = toy_server(grpc_options=GrpcOptions(max_message_size=1 << 20))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException) as raised:
            client.infer("identity", _fp32_input(np.ones(1 << 19, dtype=np.float32)))  # 2 MB
        assert raised.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "larger than max" in raised.value.message()
        small = np.ones(8, dtype=np.float32)
        assert client.infer("identity", _fp32_input(small)).as_numpy("OUTPUT0").tolist() == small.tolist()


# ---- health, flags, binding ------------------------------------------------------------------

@pytest.fixture
def health_check() -> Iterator:  # type: ignore[type-arg]
    channels: list[grpc.Channel] = []

    def check(url: str) -> int:
        channel = grpc.insecure_channel(url)
        channels.append(channel)
        return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="")).status

    yield check
    for channel in channels:
        channel.close()


def test_health_check_follows_readiness(add_model, toy_server, health_check) -> None:  # type: ignore[no-untyped-def]
    add_model("identity", IDENTITY)
    assert health_check(toy_server().grpc_url) == health_pb2.HealthCheckResponse.SERVING
    add_model("broken", IDENTITY + 'parameters { key: "fail_load" value { string_value: "1" } }\n')
    assert health_check(toy_server().grpc_url) == health_pb2.HealthCheckResponse.NOT_SERVING


def test_health_watch_streams_each_change(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("identity", IDENTITY)
    server = toy_server(model_control_mode="explicit", load_models=["identity"])
    with grpc.insecure_channel(server.grpc_url) as channel:
        updates = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
        assert next(updates).status == health_pb2.HealthCheckResponse.SERVING
        add_model("broken", IDENTITY + 'parameters { key: "fail_load" value { string_value: "1" } }\n')
        with pytest.raises(Exception):
            server.call(lambda: server.server.dataplane.load_model("broken", {}))
        assert next(updates).status == health_pb2.HealthCheckResponse.NOT_SERVING  # a wanted model failed
        updates.cancel()


def test_cli_grpc_flags() -> None:
    args = build_parser().parse_args([
        "--grpc-use-ssl-mutual=true", "--grpc-server-cert=s.crt", "--grpc-server-key=s.key",
        "--grpc-root-cert=ca.crt", "--grpc-infer-response-compression-level=medium", "--grpc-keepalive-time=1000",
        "--grpc-keepalive-timeout=500", "--grpc-keepalive-permit-without-calls", "--grpc-http2-max-ping-strikes=0",
        "--grpc-max-connection-age=60000", "--grpc-max-connection-age-grace=5000"])
    options = options_from_args(args).grpc_options
    assert options == GrpcOptions(use_ssl_mutual=True, server_cert="s.crt", server_key="s.key", root_cert="ca.crt",
                                  infer_response_compression_level="medium", keepalive_time=1000,
                                  keepalive_timeout=500, keepalive_permit_without_calls=True,
                                  http2_max_ping_strikes=0, max_connection_age=60000, max_connection_age_grace=5000)
    assert options_from_args(build_parser().parse_args([])).grpc_options == GrpcOptions()


def test_port_in_use_is_an_error(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    server = toy_server()

    async def start_second() -> None:
        await GrpcFrontend(server.server.dataplane, "127.0.0.1", server.options.grpc_port, GrpcOptions()).start()

    with pytest.raises(ServerError, match=f"cannot bind 127.0.0.1:{server.options.grpc_port}"):
        asyncio.run(start_second())
