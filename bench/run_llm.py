"""The LLM path under concurrent streaming clients: time to first token, inter-token latency and output tokens/s
through the OpenAI front-end against a transformers-backend model, with continuous batching on (max_num_seqs =
the concurrency) and off (max_num_seqs 1), at several concurrencies (see bench/README.md)."""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import openai

from triton_serve.plugin import ServerOptions
from triton_serve.testing import RunningServer, free_port
from triton_serve_transformers.tiny import make_tiny_llama

CONFIG = 'backend: "transformers"\nparameters {{ key: "max_num_seqs" value: {{ string_value: "{seqs}" }} }}\n'


@dataclass
class Stream:
    ttft_ms: float = 0.0
    gaps_ms: tuple[float, ...] = ()
    tokens: int = 0
    error: str = ""


def one_stream(client: openai.OpenAI, model: str, max_tokens: int) -> Stream:
    start = time.monotonic()
    stamps: list[float] = []
    tokens = 0
    try:
        stream = client.completions.create(model=model, prompt="Once upon a time", max_tokens=max_tokens,
                                           temperature=0, stream=True, extra_body={"ignore_eos": True})
        for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                stamps.append(time.monotonic())
                tokens += 1  # one chunk per generated step (a step whose text is empty is not counted)
    except Exception as error:  # noqa: BLE001 - reported in the table, not raised
        return Stream(error=str(error)[:80])
    if not stamps:
        return Stream(error="no tokens")
    gaps = tuple((b - a) * 1000 for a, b in zip(stamps, stamps[1:]))
    return Stream((stamps[0] - start) * 1000, gaps, tokens)


def run_level(url: str, model: str, concurrency: int, requests: int, max_tokens: int) -> dict[str, object]:
    client = openai.OpenAI(base_url=f"http://{url}/v1", api_key="unused", max_retries=0, timeout=300)
    results: list[Stream] = []
    lock = threading.Lock()
    remaining = [requests]

    def worker() -> None:
        while True:
            with lock:
                if remaining[0] == 0:
                    return
                remaining[0] -= 1
            outcome = one_stream(client, model, max_tokens)
            with lock:
                results.append(outcome)

    began = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - began
    good = [r for r in results if not r.error]
    gaps = sorted(g for r in good for g in r.gaps_ms)
    return {
        "ok": len(good), "failed": len(results) - len(good),
        "ttft_p50": statistics.median(r.ttft_ms for r in good) if good else None,
        "itl_p50": statistics.median(gaps) if gaps else None,
        "itl_p99": gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))] if gaps else None,
        "tok_s": sum(r.tokens for r in good) / elapsed,
    }


def serve(seqs: int, directory: Path) -> RunningServer:
    model = directory / "repo" / f"llm_{seqs}"
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG.format(seqs=seqs))
    (model / "1").symlink_to(directory / "weights", target_is_directory=True)
    return RunningServer(ServerOptions(
        model_repositories=[str(model.parent)], http_port=free_port(), grpc_port=free_port(),
        metrics_port=free_port(), http_address="127.0.0.1", grpc_address="127.0.0.1",
        metrics_address="127.0.0.1"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--weights", help="a Hugging Face model directory (default: a tiny random Llama made here)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=0, help="requests per level (default 4 x concurrency)")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    print(f"{'batching':<10}{'conc':>5}{'ok':>5}{'fail':>5}{'TTFT p50 ms':>13}{'ITL p50 ms':>12}"
          f"{'ITL p99 ms':>12}{'tokens/s':>10}")
    with tempfile.TemporaryDirectory() as temp:
        directory = Path(temp)
        if args.weights:
            (directory / "weights").symlink_to(Path(args.weights).resolve(), target_is_directory=True)
        else:
            make_tiny_llama(directory / "weights", context=512)
        for concurrency in args.concurrency:
            for batching, seqs in (("on", concurrency), ("off", 1)):
                if batching == "off" and concurrency == 1:
                    continue  # the same as on
                for old in (directory / "repo").glob("llm_*"):
                    for child in old.iterdir():
                        child.unlink()
                    old.rmdir()
                running = serve(seqs, directory)
                try:
                    row = run_level(running.http_url, f"llm_{seqs}", concurrency,
                                    args.requests or 4 * concurrency, args.max_tokens)
                finally:
                    running.stop()
                fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
                print(f"{batching:<10}{concurrency:>5}{row['ok']:>5}{row['failed']:>5}{fmt(row['ttft_p50']):>13}"
                      f"{fmt(row['itl_p50']):>12}{fmt(row['itl_p99']):>12}{fmt(row['tok_s']):>10}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
