"""docs/compatibility.md stays true: its flags, HTTP endpoints and RPCs are what the server has."""
from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from triton_serve._engine.cli import build_parser
from triton_serve._engine.frontend.grpc.service import InferenceServicer
from triton_serve._engine.protos import grpc_service_pb2
from triton_serve._engine.protos.grpc_service_pb2_grpc import GRPCInferenceServiceServicer

PAGE = Path(__file__).parents[1] / "docs" / "compatibility.md"
STATUSES = {"same", "different", "not yet"}


def table(title: str) -> list[list[str]]:
    """The rows of the table under ``## <title>``, cells stripped of backticks."""
    section = PAGE.read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]
    return [[cell.strip().strip("`") for cell in row.strip("|").split("|")] for row in rows]


def test_every_row_has_a_known_status() -> None:
    for title, column in (("Flags", 1), ("HTTP endpoints", 2), ("gRPC (`inference.GRPCInferenceService`)", 1),
                          ("Features", 1), ("After Triton 2.51", 2)):
        for row in table(title):
            assert row[column] in STATUSES, f"{title}: {row}"


def test_the_flags_are_exactly_the_ones_the_cli_accepts() -> None:
    accepted = {option for action in build_parser()._actions for option in action.option_strings
                if option.startswith("--") and option != "--help"}
    named = [row[0] for row in table("Flags")]
    assert len(named) == len(set(named)), "a flag is listed twice"
    aliases = {"--model-store"}  # named in the notes of --model-repository
    assert set(named) == accepted - aliases


def test_rpcs_marked_as_working_are_implemented_and_the_rest_are_not() -> None:
    service = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    rows = {row[0]: row[1] for row in table("gRPC (`inference.GRPCInferenceService`)")}
    assert set(rows) == {method.name for method in service.methods}
    for rpc, status in rows.items():
        implemented = getattr(InferenceServicer, rpc) is not getattr(GRPCInferenceServiceServicer, rpc)
        assert implemented == (status != "not yet"), rpc


def _concrete(path: str) -> str:
    return path.replace("{model}", "m").replace("{version}", "1").replace("{region}", "r").replace(
        "{repository}", "models")


@pytest.mark.parametrize("frontend_processes", [0])
def test_endpoints_marked_as_working_answer_and_the_rest_do_not_exist(add_model, toy_server) -> None:  # type: ignore[no-untyped-def]
    add_model("m", 'backend: "toy_identity"\nmax_batch_size: 0\n'
                   'input { name: "INPUT0" data_type: TYPE_FP32 dims: [1] }\n'
                   'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [1] }')
    server = toy_server()
    for method, path, status, _notes in table("HTTP endpoints"):
        url = server.metrics_url if path == "/metrics" else f"http://{server.http_url}{_concrete(path)}"
        response = httpx.request(method, url, json={} if method == "POST" else None)
        # the router's own answers for a path or method it has no route for
        unrouted = response.status_code == 405 or response.text in ('{"error":"Not Found"}', "Not Found")
        routed = not unrouted
        assert routed == (status != "not yet"), f"{method} {path}: {response.status_code} {response.text[:80]}"


def test_the_page_names_each_feature_once() -> None:
    features = [row[0] for row in table("Features")]
    assert len(features) == len(set(features))
    assert re.search(r"tests/test_compatibility_doc\.py", PAGE.read_text())
