"""build_app's arguments as `serve run` passes them (text), and the errors it gives before anything deploys."""
from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from triton_serve.plugin import http_asgi_app
from triton_serve_ray import AppArgs, build_app
from triton_serve_ray.app import INGRESS
from triton_serve_ray.routing import ChannelDataPlane


def test_command_line_text_becomes_lists_and_mappings() -> None:
    args = AppArgs.model_validate({
        "model_repository": "/a, /b",
        "models": "add_sub,identity_bytes",
        "deployment_options": '{"*": {"max_ongoing_requests": 8, "num_replicas": 1}, "add_sub": {"num_replicas": 2}}',
        "ingress_options": '{"num_replicas": 2}',
    })
    assert args.model_repository == ["/a", "/b"]
    assert args.models == ["add_sub", "identity_bytes"]
    assert args.options_for("add_sub") == {"max_ongoing_requests": 8, "num_replicas": 2}
    assert args.options_for("identity_bytes") == {"max_ongoing_requests": 8, "num_replicas": 1}
    assert args.ingress_options == {"num_replicas": 2}


def test_an_autoscaled_deployment_scales_on_the_requests_its_replicas_hold() -> None:
    args = AppArgs.model_validate({"model_repository": "/a", "deployment_options": {
        "add_sub": {"num_replicas": "auto"},
        "identity_bytes": {"autoscaling_config": {"max_replicas": 4, "policy": {"policy_function": "mine:policy"}}}}})
    assert args.options_for("add_sub") == {"num_replicas": "auto", "autoscaling_config": {
        "policy": {"policy_function": "triton_serve_ray.autoscaling:ongoing_requests_policy"}}}
    assert args.options_for("identity_bytes")["autoscaling_config"]["policy"] == {"policy_function": "mine:policy"}


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValidationError, match="expected a JSON object"):
        AppArgs.model_validate({"model_repository": "/a", "deployment_options": "add_sub:2"})
    with pytest.raises(ValidationError, match="replicas"):
        AppArgs.model_validate({"model_repository": "/a", "replicas": "2"})
    with pytest.raises(ValidationError, match="model_repository"):
        AppArgs.model_validate({})


def test_unknown_models_are_refused_with_the_models_there(example_repository: Path) -> None:
    message = ("no model 'nope' in .*models there: add_sub, bls_add_sub, chat, ensemble_add_sub, identity_bytes, "
               "postprocess, preprocess, token_streamer, tokenizer")
    with pytest.raises(ValueError, match=message):
        build_app({"model_repository": str(example_repository), "models": "add_sub,nope"})
    with pytest.raises(ValueError, match="no model 'nope'"):
        build_app({"model_repository": str(example_repository), "deployment_options": {"nope": {"num_replicas": 2}}})


def test_a_repository_without_models_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"no model in {re.escape(str(tmp_path))}"):
        build_app({"model_repository": str(tmp_path)})


def test_a_model_may_not_take_the_ingress_name(tmp_path: Path, example_repository: Path) -> None:
    config = (example_repository / "add_sub" / "config.pbtxt").read_text()
    (tmp_path / INGRESS / "1").mkdir(parents=True)
    (tmp_path / INGRESS / "config.pbtxt").write_text(config.replace('"add_sub"', f'"{INGRESS}"'))
    with pytest.raises(ValueError, match=f"may not be named '{INGRESS}'"):
        build_app({"model_repository": str(tmp_path)})


def test_the_front_door_answers_every_data_plane_call_of_the_http_and_grpc_front_ends() -> None:
    """The front door runs the core's front-ends: each data-plane method they call must exist on its data plane."""
    package = http_asgi_app.__module__.rpartition(".")[0].rpartition(".")[0]  # the front-ends' package
    front_end_modules = [module for name, module in list(sys.modules.items())
                         if name.startswith((package + ".http.", package + ".grpc."))]
    source = "".join(inspect.getsource(module) for module in front_end_modules)
    called = set(re.findall(r"self\.(?:dataplane|api)\.(\w+)", source))
    assert {"submit", "model_config", "repository_index"} <= called
    dataplane = ChannelDataPlane([], "triton", lambda: None)  # type: ignore[arg-type,return-value]
    missing = sorted(name for name in called if not hasattr(dataplane, name))
    assert not missing, f"ChannelDataPlane lacks {missing}, which the front-ends call"
