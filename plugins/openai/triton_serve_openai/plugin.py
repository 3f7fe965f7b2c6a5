"""Registers the OpenAI API under ``/v1/`` on the HTTP port, and vLLM's ``/tokenize`` and ``/detokenize``."""
from __future__ import annotations

from typing import Any

from triton_serve.frontend import DataPlaneAPI, HttpAppRegistry, OpenAIOptions, hookimpl


def make_app(api: DataPlaneAPI, max_input_size: int, options: OpenAIOptions) -> Any:
    from .app import OpenAIApp  # imported when a front-end starts, not when plugins are listed

    return OpenAIApp(api, max_input_size, options)


@hookimpl
def tserve_register_http_apps(registry: HttpAppRegistry) -> None:
    registry.add("/v1/", make_app, openai_options=True)  # --openai-port, --openai-restricted-api, --tool-call-parser
    for prefix in ("/tokenize/", "/detokenize/"):  # vLLM serves these beside /v1
        registry.add(prefix, make_app, openai_options=True)
