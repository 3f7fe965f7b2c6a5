"""The load generator of bench/run_llm.py: concurrent streaming ``/v1/completions`` requests over aiohttp, and
the statistics of one cell (output tokens/s, time to first token and inter-token latency percentiles)."""
from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass
class Stream:
    """What one streamed request gave: seconds to its first text, gaps between text chunks, output tokens."""

    ttft_s: float = 0.0
    gaps_s: list[float] = field(default_factory=list)
    tokens: int = 0
    from_usage: bool = False  # tokens from the final usage chunk, else the count of chunks with text
    error: str = ""


@dataclass
class Cell:
    """One engine at one concurrency: the figures a run reports (times in milliseconds)."""

    engine: str
    concurrency: int
    ok: int = 0
    failed: int = 0
    elapsed_s: float = 0.0
    output_tokens: int = 0
    tokens_per_s: float | None = None
    token_count: str = "-"  # "usage" (stream_options.include_usage), "chunks" (chunks with text), "mixed"
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    errors: list[str] = field(default_factory=list)  # the first few distinct failures


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile with linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def completion_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """Greedy, ``ignore_eos`` (so every request generates ``max_tokens``), streamed, usage in a last chunk."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}


async def one_stream(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Stream:
    """Send one request and read its Server-Sent Events to ``data: [DONE]``."""
    began = time.perf_counter()
    stamps: list[float] = []
    usage_tokens: int | None = None
    try:
        async with session.post(url, json=body) as response:
            if response.status != 200:
                return Stream(error=f"HTTP {response.status}: {(await response.text())[:160]}")
            async for raw in response.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    return Stream(error=f"stream error: {json.dumps(event['error'])[:160]}")
                if any(choice.get("text") for choice in event.get("choices") or ()):
                    stamps.append(time.perf_counter())
                if event.get("usage"):
                    usage_tokens = event["usage"].get("completion_tokens")
            else:
                return Stream(error="the stream ended without data: [DONE]")
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as error:
        return Stream(error=f"{type(error).__name__}: {error}"[:160])
    if not stamps:
        return Stream(error="no text in the stream")
    gaps = [later - earlier for earlier, later in zip(stamps, stamps[1:])]
    if usage_tokens is not None:
        return Stream(stamps[0] - began, gaps, usage_tokens, from_usage=True)
    return Stream(stamps[0] - began, gaps, len(stamps))


async def run_clients(base_url: str, model: str, prompt: str, max_tokens: int, concurrency: int, *,
                      requests: int = 0, duration_s: float = 0.0,
                      timeout_s: float = 600) -> tuple[list[Stream], float]:
    """``concurrency`` clients each sending one request after another until ``requests`` have been sent in all,
    or (``requests`` 0) until ``duration_s`` has passed (requests in flight then are finished and counted). Returns
    every request's stream and the seconds from the first send to the last answer."""
    url = f"{base_url}/v1/completions"
    body = completion_body(model, prompt, max_tokens)
    streams: list[Stream] = []
    sent = 0
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        began = time.perf_counter()
        deadline = began + duration_s

        async def client() -> None:
            nonlocal sent
            while (sent < requests) if requests else (time.perf_counter() < deadline):
                sent += 1
                streams.append(await one_stream(session, url, body))

        await asyncio.gather(*(client() for _ in range(concurrency)))
        return streams, time.perf_counter() - began


def summarize(engine: str, concurrency: int, streams: list[Stream], elapsed_s: float) -> Cell:
    """The cell's figures from its streams; tokens/s is every answered request's output tokens over ``elapsed_s``
    (the time under load, summed over the cell's slices)."""
    good = [stream for stream in streams if not stream.error]
    cell = Cell(engine, concurrency, ok=len(good), failed=len(streams) - len(good), elapsed_s=elapsed_s)
    cell.errors = list(dict.fromkeys(stream.error for stream in streams if stream.error))[:3]
    if not good:
        return cell
    cell.output_tokens = sum(stream.tokens for stream in good)
    cell.tokens_per_s = cell.output_tokens / elapsed_s if elapsed_s > 0 else None
    sources = {stream.from_usage for stream in good}
    cell.token_count = "mixed" if len(sources) == 2 else "usage" if True in sources else "chunks"
    ttfts = [stream.ttft_s * 1000 for stream in good]
    gaps = [gap * 1000 for stream in good for gap in stream.gaps_s]
    cell.ttft_p50_ms, cell.ttft_p99_ms = percentile(ttfts, 50), percentile(ttfts, 99)
    cell.itl_p50_ms, cell.itl_p99_ms = percentile(gaps, 50), percentile(gaps, 99)
    return cell
