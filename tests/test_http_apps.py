"""Plugin apps on the HTTP port (the tserve_register_http_apps hook): routed by prefix beside /v2."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from triton_serve.frontend import DataPlaneAPI, HttpAppRegistry, ServerError, hookimpl


def _echo_app(api: DataPlaneAPI, max_input_size: int) -> Callable[..., Any]:
    """Answers with the path it got, the size limit, and whether the seam says the server is live."""
    async def app(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        body = json.dumps({"path": scope["path"], "max": max_input_size, "live": await api.live()}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
    return app


class EchoPlugin:
    @hookimpl
    def tserve_register_http_apps(self, registry: HttpAppRegistry) -> None:
        registry.add("/echo/", _echo_app)


def test_a_plugin_app_serves_its_prefix_beside_v2(tserve: Any, tmp_path: Path) -> None:
    server = tserve(tmp_path, extra_plugins=[("echo", EchoPlugin())], http_max_input_size=12345)
    with httpx.Client(base_url=f"http://{server.http_url}", timeout=10) as client:
        answer = client.get("/echo/a/b")
        assert answer.status_code == 200
        assert answer.json() == {"path": "/echo/a/b", "max": 12345, "live": True}
        assert client.get("/echo").json()["path"] == "/echo"
        assert client.get("/v2/health/live").status_code == 200  # /v2 still served by the core
        assert client.get("/echoes").status_code == 404  # a longer name is not under the prefix


def test_prefixes_are_checked_and_unique() -> None:
    registry = HttpAppRegistry()
    for bad in ("v1/", "/v1", "/", "/v2/", "/v2/models/"):
        with pytest.raises(ValueError):
            registry.add(bad, _echo_app)
    registry.current_plugin = "first"
    registry.add("/v1/", _echo_app)
    registry.current_plugin = "second"
    with pytest.raises(ServerError, match="'/v1/' is registered by both plugin 'first' and plugin 'second'"):
        registry.add("/v1/", _echo_app)
    assert registry.names() == ["/v1/"] and registry.plugins() == ["first"]
