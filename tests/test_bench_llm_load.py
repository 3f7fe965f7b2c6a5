"""bench/llm_load.py, the load generator of bench/run_llm.py, against a fake Server-Sent Events server: what it
sends, how it counts tokens (usage when the stream gives it, else chunks), failures, concurrency, statistics; and
how run_llm splits a cell into the slices the servers take turns at."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import pytest
from aiohttp import web


def _load_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("llm_load", Path(__file__).parents[1] / "bench" / "llm_load.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


llm_load = _load_module()
TEXT_CHUNKS = 5


async def _cell(url: str, model: str, concurrency: int, *, engine: str = "", requests: int = 0,
                duration_s: float = 0.0) -> Any:
    """One cell as run_llm makes it: the clients' streams, summarized."""
    streams, elapsed_s = await llm_load.run_clients(url, model, "Hello", 7, concurrency, requests=requests,
                                                    duration_s=duration_s)
    return llm_load.summarize(engine, concurrency, streams, elapsed_s)


class FakeServer:
    """``/v1/completions`` streaming TEXT_CHUNKS text chunks after an empty one; the model name picks the
    behaviour: ``usage`` (a usage chunk claiming twice as many tokens), ``chunks`` (no usage), ``broken`` (no
    ``[DONE]``), ``refuse`` (HTTP 400). The first ``wave`` requests are held until all of them have arrived."""

    def __init__(self, wave: int) -> None:
        self.wave = wave
        self.bodies: list[dict[str, Any]] = []
        self.in_flight = self.most_in_flight = 0
        self.arrived = asyncio.Event()

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        if body["model"] == "refuse":
            return web.json_response({"error": {"message": "no"}}, status=400)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if len(self.bodies) >= self.wave:
                self.arrived.set()
            await asyncio.wait_for(self.arrived.wait(), 30)
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            events: list[dict[str, Any] | str] = [{"choices": [{"index": 0, "text": ""}], "usage": None}]
            events += [{"choices": [{"index": 0, "text": f"t{i}"}], "usage": None} for i in range(TEXT_CHUNKS)]
            if body["model"] == "usage":
                events.append({"choices": [], "usage": {"completion_tokens": 2 * TEXT_CHUNKS}})
            if body["model"] != "broken":
                events.append("[DONE]")
            for event in events:
                data = event if isinstance(event, str) else json.dumps(event)
                await response.write(f"data: {data}\n\n".encode())
                await asyncio.sleep(0)  # one write per loop turn, as a server streaming tokens would
            await response.write_eof()
            return response
        finally:
            self.in_flight -= 1


def _with_server(wave: int, scenario: Callable[[str, FakeServer], Awaitable[Any]]) -> tuple[Any, FakeServer]:
    async def main() -> tuple[Any, FakeServer]:
        fake = FakeServer(wave)
        app = web.Application()
        app.router.add_post("/v1/completions", fake.completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            return await asyncio.wait_for(scenario(f"http://127.0.0.1:{port}", fake), 60), fake
        finally:
            await runner.cleanup()
    return asyncio.run(main())


def test_counts_usage_tokens_and_keeps_to_the_concurrency() -> None:
    async def scenario(url: str, _: FakeServer) -> Any:
        return await _cell(url, "usage", 3, engine="fake", requests=7)

    cell, fake = _with_server(3, scenario)
    assert (cell.engine, cell.concurrency, cell.ok, cell.failed, cell.errors) == ("fake", 3, 7, 0, [])
    assert len(fake.bodies) == 7 and fake.most_in_flight == 3
    assert fake.bodies[0] == {"model": "usage", "prompt": "Hello", "max_tokens": 7, "temperature": 0,
                              "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    assert cell.token_count == "usage" and cell.output_tokens == 7 * 2 * TEXT_CHUNKS
    assert cell.tokens_per_s == cell.output_tokens / cell.elapsed_s
    assert 0 < cell.ttft_p50_ms <= cell.ttft_p99_ms and 0 <= cell.itl_p50_ms <= cell.itl_p99_ms


def test_counts_chunks_with_text_without_usage_and_reports_failures() -> None:
    async def scenario(url: str, _: FakeServer) -> Any:
        chunks = await _cell(url, "chunks", 2, requests=4)
        async with aiohttp.ClientSession() as session:
            one = await llm_load.one_stream(session, f"{url}/v1/completions", llm_load.completion_body("chunks", "", 1))
        broken = await _cell(url, "broken", 1, requests=2)
        refused = await _cell(url, "refuse", 1, requests=1)
        return chunks, one, broken, refused

    (chunks, one, broken, refused), _ = _with_server(2, scenario)
    assert (chunks.ok, chunks.failed, chunks.token_count, chunks.output_tokens) == (4, 0, "chunks", 4 * TEXT_CHUNKS)
    assert not one.error and not one.from_usage and one.tokens == TEXT_CHUNKS and len(one.gaps_s) == TEXT_CHUNKS - 1
    assert (broken.ok, broken.failed, broken.errors) == (0, 2, ["the stream ended without data: [DONE]"])
    assert broken.tokens_per_s is None and broken.ttft_p50_ms is None
    assert refused.failed == 1 and refused.errors[0].startswith("HTTP 400: ")


def test_a_duration_cell_answers_every_request_it_sent() -> None:
    async def scenario(url: str, _: FakeServer) -> Any:
        return await _cell(url, "usage", 2, duration_s=0.2)

    cell, fake = _with_server(1, scenario)
    assert cell.failed == 0 and cell.ok == len(fake.bodies)


def test_statistics() -> None:
    assert llm_load.percentile([], 50) is None
    assert llm_load.percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert abs(llm_load.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 99) - 4.96) < 1e-9  # numpy.percentile's value
    streams = [llm_load.Stream(0.010, [0.001, 0.003], 3, from_usage=True),
               llm_load.Stream(0.030, [0.002], 2), llm_load.Stream(error="boom")]
    cell = llm_load.summarize("e", 2, streams, 2.0)
    assert (cell.ok, cell.failed, cell.errors, cell.output_tokens, cell.tokens_per_s) == (2, 1, ["boom"], 5, 2.5)
    assert cell.token_count == "mixed"
    assert abs(cell.ttft_p50_ms - 20.0) < 1e-9 and abs(cell.itl_p50_ms - 2.0) < 1e-9
    assert abs(cell.ttft_p99_ms - 29.8) < 1e-9 and abs(cell.itl_p99_ms - 2.98) < 1e-9


def test_run_llm_splits_a_cell_into_slices_of_whole_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "bench"))
    import run_llm

    def slices(concurrency: int, *arguments: str) -> list[tuple[int, float]]:
        monkeypatch.setattr(sys, "argv", ["run_llm.py", *arguments])
        return run_llm.slice_loads(run_llm.parse_args(), concurrency)

    assert slices(8, "--rounds", "16") == [(32, 0.0)] * 4
    assert slices(8, "--rounds", "6") == [(16, 0.0), (16, 0.0), (8, 0.0), (8, 0.0)]
    assert slices(32, "--rounds", "2") == [(32, 0.0), (32, 0.0)]  # fewer rounds than slices: a slice each
    assert slices(8, "--requests", "10", "--slices", "3") == [(4, 0.0), (3, 0.0), (3, 0.0)]  # not whole rounds
    assert slices(1, "--duration", "60", "--slices", "3") == [(0, 20.0)] * 3
    assert sum(requests for requests, _ in slices(32, "--rounds", "5", "--slices", "4")) == 5 * 32
