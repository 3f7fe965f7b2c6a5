"""The OpenAI front-end flags (``--openai-port``, ``--openai-restricted-api``) as Triton's front-end parses them;
serving them is tested with the plugin (plugins/openai/tests/test_openai_port.py)."""
from __future__ import annotations

import pytest

from triton_serve._engine.cli import build_parser, options_from_args
from triton_serve._engine.errors import ServerError
from triton_serve._engine.frontend.frontends import FrontendOptions


def _options(*argv: str) -> FrontendOptions:
    return options_from_args(build_parser().parse_args(list(argv))).frontend_options()


def test_defaults_and_the_port_alone() -> None:
    assert _options().openai.port is None and _options().openai.restricted_api == {}
    assert _options("--openai-port").openai.port == 9000
    assert _options("--openai-port", "9100").openai.port == 9100


def test_groups_and_their_headers_survive_the_trip_to_a_frontend_process() -> None:
    options = _options("--openai-restricted-api", "inference,health", "api-key", "s1",
                       "--openai-restricted-api", "model-repository", "admin-key", "s2", "--tool-call-parser", "mistral")
    assert options.openai.restricted_api == {"inference": ("api-key", "s1"), "health": ("api-key", "s1"),
                                             "model-repository": ("admin-key", "s2")}
    assert options.openai.tool_call_parser == "mistral"
    assert FrontendOptions.from_dict(options.to_dict()) == options


def test_the_tool_call_parse_limit_and_what_the_server_tells_the_app() -> None:
    assert _options().openai.max_tool_call_parse_bytes == 128 * 1024  # Triton's default
    assert _options("--max-tool-call-parse-bytes", "512").openai.max_tool_call_parse_bytes == 512
    assert not _options().openai.explicit_model_control
    options = _options("--model-control-mode", "explicit", "--metrics-port", "9102").openai
    assert options.explicit_model_control and options.metrics_endpoint == ("127.0.0.1", 9102)
    assert _options("--allow-metrics", "false").openai.metrics_endpoint is None


@pytest.mark.parametrize("argv, message", [
    (["--openai-restricted-api", "inference,wizardry", "k", "v"],
     "Unknown API 'wizardry'. Available APIs: ['inference', 'model-repository', 'metrics', 'health']"),
    (["--openai-restricted-api", "inference", "k", "v", "--openai-restricted-api", "health,inference", "k2", "v"],
     "restricted api 'inference' can not be specified in multiple config groups"),
    (["--openai-port", "8000"], "--openai-port 8000 is the --http-port too"),
    (["--max-tool-call-parse-bytes", "0"], "--max-tool-call-parse-bytes must be at least 1, got 0"),
])
def test_bad_flags_stop_the_start(argv: list[str], message: str) -> None:
    with pytest.raises(ServerError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _options(*argv)
