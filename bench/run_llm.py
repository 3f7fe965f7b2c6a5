"""LLM serving side by side, in one run: vLLM's own OpenAI server, and triton-serve's OpenAI front-end over its
`vllm` and `transformers` backends, on the same random-weight Llama under the same streaming /v1/completions
load, the servers running together and taking turns under it: output tokens/s, time to first token and
inter-token latency (p50/p99) at each concurrency, with ours/vLLM ratios. With --cuda (a CUDA machine, no vLLM
there): the `transformers` backend on the GPU beside transformers' own `generate` on the same model. See
bench/README.md."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any

import uvloop

from llm_load import Cell, Stream, run_clients, summarize
from run_add_sub import LOOPBACK, RESULTS, SCRIPTS, Ports, ServerFailed, server_flags, stop, wait_ready

MODEL = "llm"  # the name every server serves the model under
ENGINES = ("vllm-server", "vllm", "transformers")  # vLLM's own server; ours with each backend
GENERATE = "generate"  # transformers' own generate, the reference of --cuda


@dataclass(frozen=True)
class Shape:
    """A random-weight Llama with the example's character tokenizer (triton_serve_transformers.tiny)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    context: int
    dtype: str
    seed: int = 0

    def key(self) -> str:
        return (f"llama-h{self.hidden}-i{self.intermediate}-l{self.layers}-a{self.heads}-kv{self.kv_heads}"
                f"-d{self.head_dim}-ctx{self.context}-{self.dtype}-s{self.seed}")


CPU_SHAPE = Shape(hidden=512, intermediate=1536, layers=8, heads=8, kv_heads=4, head_dim=64, context=1024,
                  dtype="float32")  # about 25M parameters: the model of issue 32
CUDA_SHAPE = Shape(hidden=2048, intermediate=5632, layers=22, heads=32, kv_heads=4, head_dim=64, context=2048,
                   dtype="bfloat16")  # TinyLlama-1.1B's layout with the character vocabulary: about 1.0B

TRANSFORMERS_CONFIG = ('backend: "transformers"\nmax_batch_size: 0\n'
                       'parameters {{ key: "max_num_seqs" value: {{ string_value: "{seqs}" }} }}\n'
                       'instance_group [{{ count: 1 kind: {kind} }}]\n')
# Triton's vllm_backend sample model (samples/model_repository/vllm_model): the engine batches, decoupled.
VLLM_CONFIG = ('backend: "vllm"\nmax_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n'
               'instance_group [{ count: 1 kind: KIND_MODEL }]\n')


def make_model(shape: Shape, models: Path) -> Path:
    """The model's directory under ``models``, made once per shape: the tiny example model's tokenizer, with
    the weights and config replaced by a random model of ``shape``. Made aside, then moved in whole."""
    target = models / shape.key()
    if (target / "bench-model.json").is_file():
        return target
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from triton_serve_transformers.tiny import make_tiny_llama

    scratch = models / f".making-{shape.key()}-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    make_tiny_llama(scratch, context=shape.context, seed=shape.seed)
    config = LlamaConfig.from_pretrained(scratch)
    config.hidden_size, config.intermediate_size = shape.hidden, shape.intermediate
    config.num_hidden_layers, config.num_attention_heads = shape.layers, shape.heads
    config.num_key_value_heads, config.head_dim = shape.kv_heads, shape.head_dim
    torch.manual_seed(shape.seed)
    model = LlamaForCausalLM(config).to(getattr(torch, shape.dtype))
    model.save_pretrained(scratch)
    parameters = sum(tensor.numel() for tensor in model.parameters())
    (scratch / "bench-model.json").write_text(json.dumps({**asdict(shape), "parameters": parameters}) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(scratch, target)
    return target


def model_parameters(directory: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError, KeyError):
        return int(json.loads((directory / "bench-model.json").read_text())["parameters"])
    return None


def load_line() -> tuple[str, tuple[float, float, float]]:
    """``uptime``'s line and the load averages it shows."""
    done = subprocess.run(["uptime"], capture_output=True, text=True, check=False)
    return done.stdout.strip(), os.getloadavg()


def repository(engine: str, model_dir: Path, shape: Shape, args: argparse.Namespace) -> Path:
    """A fresh model repository serving ``model_dir`` as MODEL with backend ``engine``."""
    root: Path = args.work_dir / "repos" / engine
    shutil.rmtree(root, ignore_errors=True)
    model = root / MODEL
    model.mkdir(parents=True)
    if engine == "vllm":
        engine_args = {"model": str(model_dir), "max_model_len": shape.context, "dtype": shape.dtype,
                       "kv_cache_memory_bytes": kv_cache_bytes(args)}
        (model / "config.pbtxt").write_text(VLLM_CONFIG)
        (model / "1").mkdir()
        (model / "1" / "model.json").write_text(json.dumps(engine_args, indent=2) + "\n")
    else:
        kind = "KIND_GPU" if args.cuda else "KIND_CPU"
        (model / "config.pbtxt").write_text(TRANSFORMERS_CONFIG.format(seqs=args.max_num_seqs, kind=kind))
        (model / "1").symlink_to(model_dir, target_is_directory=True)
    return root


def kv_cache_bytes(args: argparse.Namespace) -> int:
    """vLLM's key-value cache, the same for its server and our vllm backend. Explicit: by default vLLM on CPU
    reserves 92% of the memory node (``gpu_memory_utilization``) and refuses to start where less is free."""
    return int(args.kv_cache_gib * 2**30)


@dataclass
class Launch:
    """How to start one server, and where to send the load once ``ready`` URLs all answer 2xx."""

    command: list[str]
    ready: list[str]
    base_url: str


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (bound together, so none repeats)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in sockets]


# vLLM's engine core and worker poll for a second after their last step (vLLM's shared-memory queue): a cell
# starts this long after the last one ended, so that only the server under load runs during it.
SETTLE_S = 2.0


def launch(engine: str, model_dir: Path, shape: Shape, args: argparse.Namespace) -> Launch:
    *triton_ports, openai_port = free_ports(4)
    ports = Ports(*triton_ports)
    if engine == "vllm-server":
        base = f"http://{LOOPBACK}:{ports.http}"
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                   "--served-model-name", MODEL, "--max-model-len", str(shape.context), "--dtype", shape.dtype,
                   "--kv-cache-memory-bytes", str(kv_cache_bytes(args)), "--host", LOOPBACK,
                   "--port", str(ports.http)]
        return Launch(command, [f"{base}/health", f"{base}/v1/models"], base)
    flags = server_flags(repository(engine, model_dir, shape, args), MODEL, ports)
    command = [str(SCRIPTS / "triton-serve"), *flags, f"--openai-port={openai_port}", *args.ours_flags.split()]
    v2 = f"http://{LOOPBACK}:{ports.http}/v2"
    base = f"http://{LOOPBACK}:{openai_port}"
    return Launch(command, [f"{v2}/health/ready", f"{v2}/models/{MODEL}/ready", f"{base}/v1/models"], base)


@contextlib.contextmanager
def served(launch_: Launch, args: argparse.Namespace, log_path: Path) -> Iterator[None]:
    """The server running, ready, until the block ends; then stopped (SIGINT) and its whole process group gone:
    vLLM's engine core runs in a child process of its own.

    The server gets a process group of its own but stays in this session: this kernel schedules each session as
    one group (``/proc/sys/kernel/sched_autogroup_enabled``), and with the server in a session of its own the
    load client on the same two cores, in another group, was at times left runnable but not run for 1.5-5 s
    while vLLM's busy engine core and worker ran (seen with our server, which has one more busy process in its
    group, and not with vLLM's): every request of that round then measured a TTFT of seconds. In one group,
    every server is measured without it."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen(launch_.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   process_group=0)
        try:
            wait_ready(process, launch_.ready, args.start_timeout, log_path)
            yield
        finally:
            stop(process)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # children left behind by a server that exited on SIGINT


def start_servers(model_dir: Path, shape: Shape, args: argparse.Namespace, stem: str,
                  stack: contextlib.ExitStack) -> dict[str, Launch | str]:
    """Every engine's server, started one after another (each ready before the next starts) and kept running
    until ``stack`` closes; for a server that did not start, why."""
    servers: dict[str, Launch | str] = {}
    for engine in args.engines:
        launch_ = launch(engine, model_dir, shape, args)
        log_path = RESULTS / f"{stem}-{engine}.log"
        print(f"\n{engine}: {' '.join(launch_.command)}\n  log: {log_path}", flush=True)
        started = time.monotonic()
        try:
            stack.enter_context(served(launch_, args, log_path))
        except ServerFailed as error:
            print(f"  {engine} failed: {error}", file=sys.stderr, flush=True)
            servers[engine] = f"server {error}"
            continue
        print(f"  ready after {time.monotonic() - started:.0f} s", flush=True)
        servers[engine] = launch_
    return servers


def measure_level(servers: dict[str, Launch | str], concurrency: int, args: argparse.Namespace,
                  runner: asyncio.Runner) -> list[Cell]:
    """Every server's cell at ``concurrency``, in slices: the cell's requests (or seconds) are split into
    ``--slices`` parts, run server after server, in ``--engines`` order and then backwards (A B C C B A A B C ...),
    so that the machine's drift over the minutes a level takes falls on every server alike. Each slice starts
    ``SETTLE_S`` after the last one ended; before the first, one unmeasured request per client warms each server."""
    running = {engine: server for engine, server in servers.items() if isinstance(server, Launch)}
    if args.warmup_tokens:
        for launch_ in running.values():
            runner.run(run_clients(launch_.base_url, MODEL, args.prompt, args.warmup_tokens, concurrency,
                                   requests=concurrency, timeout_s=args.request_timeout))
    streams: dict[str, list[Stream]] = {engine: [] for engine in running}
    elapsed_s = dict.fromkeys(running, 0.0)
    for index, (requests, duration_s) in enumerate(slice_loads(args, concurrency)):
        for engine in list(running) if index % 2 == 0 else list(reversed(running)):
            time.sleep(SETTLE_S)
            got, seconds = runner.run(run_clients(running[engine].base_url, MODEL, args.prompt, args.max_tokens,
                                                  concurrency, requests=requests, duration_s=duration_s,
                                                  timeout_s=args.request_timeout))
            streams[engine] += got
            elapsed_s[engine] += seconds
    cells = []
    for engine, server in servers.items():
        if isinstance(server, str):
            cells.append(Cell(engine, concurrency, errors=[server]))
            continue
        cells.append(summarize(engine, concurrency, streams[engine], elapsed_s[engine]))
        print(f"  {engine}: {progress_line(cells[-1])}", flush=True)
    return cells


def slice_loads(args: argparse.Namespace, concurrency: int) -> list[tuple[int, float]]:
    """Each slice's (requests, seconds) at ``concurrency``: whole rounds of c where the cell is rounds, else as
    even a split as the count allows; a cell of fewer requests than slices has fewer slices."""
    if args.duration:
        return [(0, args.duration / args.slices)] * args.slices
    total = requests_per_cell(args, concurrency)
    unit = concurrency if total % concurrency == 0 else 1
    parts = min(args.slices, total // unit)
    base, extra = divmod(total // unit, parts)
    return [((base + (index < extra)) * unit, 0.0) for index in range(parts)]


def requests_per_cell(args: argparse.Namespace, concurrency: int) -> int:
    if args.duration:
        return 0
    return args.requests or args.rounds * concurrency


def generate_cells(model_dir: Path, shape: Shape, args: argparse.Namespace, device: str) -> list[Cell]:
    """transformers' own ``generate`` on ``device``: one batch of ``concurrency`` copies of the prompt, greedy,
    exactly ``max_tokens`` new tokens each, rounds until the cell's request count (or duration) is reached."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # Any, as in the transformers plugin: transformers' stubs type the model's .to() as taking a model.
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, shape.dtype))
    model = model.to(device).eval()

    def run_batch(inputs: dict[str, torch.Tensor], new_tokens: int) -> int:
        with torch.inference_mode():
            output = model.generate(**inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                    pad_token_id=tokenizer.pad_token_id or 0)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        return int(output.shape[0] * (output.shape[1] - inputs["input_ids"].shape[1]))

    cells = []
    print(f"\n{GENERATE}: {load_line()[0]}", flush=True)
    for concurrency in args.concurrency:
        inputs = tokenizer([args.prompt] * concurrency, return_tensors="pt").to(device)
        run_batch(inputs, max(1, args.warmup_tokens))
        rounds = math.ceil(requests_per_cell(args, concurrency) / concurrency)
        began = time.perf_counter()
        tokens = done = 0
        while (done < rounds) if rounds else (time.perf_counter() - began < args.duration):
            tokens += run_batch(inputs, args.max_tokens)
            done += 1
        elapsed = time.perf_counter() - began
        cell = Cell(GENERATE, concurrency, ok=done * concurrency, elapsed_s=elapsed, output_tokens=tokens,
                    tokens_per_s=tokens / elapsed, token_count="generate")
        print(f"  c={concurrency}: {progress_line(cell)}", flush=True)
        cells.append(cell)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return cells


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def progress_line(cell: Cell) -> str:
    line = (f"{cell.ok} ok, {cell.failed} failed, {fmt(cell.tokens_per_s)} tokens/s ({cell.token_count}), "
            f"TTFT p50 {fmt(cell.ttft_p50_ms)} ms, ITL p50 {fmt(cell.itl_p50_ms)} ms")
    return line + "".join(f"\n    error: {error}" for error in cell.errors)


def comparisons(cells: list[Cell], reference: str) -> dict[tuple[str, int], dict[str, float | None]]:
    """Per (engine, concurrency): tokens/s over the reference's, and TTFT p50 minus the reference's (ms)."""
    by_key = {(cell.engine, cell.concurrency): cell for cell in cells}
    out: dict[tuple[str, int], dict[str, float | None]] = {}
    for cell in cells:
        base = by_key.get((reference, cell.concurrency))
        if cell.engine == reference or base is None:
            continue
        ratio = (cell.tokens_per_s / base.tokens_per_s
                 if cell.tokens_per_s and base.tokens_per_s else None)
        delta = (cell.ttft_p50_ms - base.ttft_p50_ms
                 if cell.ttft_p50_ms is not None and base.ttft_p50_ms is not None else None)
        out[(cell.engine, cell.concurrency)] = {"tokens_per_s_ratio": ratio, "ttft_p50_delta_ms": delta}
    return out


def markdown(cells: list[Cell], reference: str, header: str) -> str:
    compared = comparisons(cells, reference)
    columns = ["c", "engine", "ok / failed", "tokens/s", "tokens from", "TTFT p50 / p99 (ms)",
               "ITL p50 / p99 (ms)", f"tokens/s ÷ {reference}", f"TTFT p50 − {reference} (ms)"]
    lines = [header, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for cell in sorted(cells, key=lambda cell: cell.concurrency):  # stable: the engines' order within a level
        versus = compared.get((cell.engine, cell.concurrency), {})
        lines.append("| " + " | ".join([
            str(cell.concurrency), cell.engine, f"{cell.ok} / {cell.failed}", fmt(cell.tokens_per_s), cell.token_count,
            f"{fmt(cell.ttft_p50_ms)} / {fmt(cell.ttft_p99_ms)}", f"{fmt(cell.itl_p50_ms)} / {fmt(cell.itl_p99_ms)}",
            fmt(versus.get("tokens_per_s_ratio"), 2), fmt(versus.get("ttft_p50_delta_ms"))]) + " |")
    notes = [f"- {cell.engine} c={cell.concurrency}: {error}" for cell in cells for error in cell.errors]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=None,
                        help="servers to run, in this order: vllm-server (vLLM's own OpenAI server), vllm and "
                             "transformers (triton-serve with that backend); default: all three, or transformers "
                             "with --cuda")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 32],
                        help="concurrent clients per cell (default: 1 8 32)")
    count = parser.add_mutually_exclusive_group()
    count.add_argument("--requests", type=int, default=0, help="requests per cell (default: --rounds x c)")
    count.add_argument("--rounds", type=int, default=16,
                       help="requests per cell as rounds of c (default 16): with equal lengths each round's c "
                            "streams start and end together, so a round is one measurement of TTFT, not c")
    count.add_argument("--duration", type=float, default=0.0,
                       help="seconds per cell instead of a request count (requests in flight then are finished)")
    parser.add_argument("--slices", type=int, default=4,
                        help="parts each cell is run in, the servers taking turns (default 4)")
    parser.add_argument("--max-tokens", type=int, default=256,
                        help="output tokens per request (ignore_eos; default 256)")
    parser.add_argument("--prompt", default="Hello there, how are", help="default: %(default)r")
    parser.add_argument("--warmup-tokens", type=int, default=16,
                        help="before each cell, one unmeasured request per client of this many tokens "
                             "(default 16; 0: none)")
    parser.add_argument("--max-num-seqs", type=int, default=0,
                        help="the transformers backend's max_num_seqs (0: the largest concurrency)")
    parser.add_argument("--kv-cache-gib", type=float, default=1.0,
                        help="vLLM's key-value cache in GiB, for its server and our vllm backend alike "
                             "(--kv-cache-memory-bytes, model.json kv_cache_memory_bytes; default 1)")
    parser.add_argument("--start-timeout", type=float, default=600,
                        help="seconds for a server to get ready (vLLM's first start compiles for a minute or "
                             "more; default 600)")
    parser.add_argument("--request-timeout", type=float, default=900,
                        help="seconds for one whole streamed request (default 900)")
    parser.add_argument("--ours-flags", default="", help="extra triton-serve flags")
    parser.add_argument("--work-dir", type=Path, default=RESULTS / "llm-work",
                        help="where models (cached by shape) and model repositories are made "
                             "(default: bench/results/llm-work)")
    parser.add_argument("--weights", type=Path, help="serve this Hugging Face directory instead of a random model")
    parser.add_argument("--cuda", action="store_true",
                        help="the transformers backend on CUDA beside transformers' generate (no vLLM), with a "
                             "bigger model by default")
    shape = parser.add_argument_group("model shape (default: issue 32's 25M model; with --cuda about 1.0B)")
    for item in fields(Shape):
        flag = f"--{item.name.replace('_', '-')}"
        defaults = f"default {getattr(CPU_SHAPE, item.name)}; --cuda {getattr(CUDA_SHAPE, item.name)}"
        if item.name == "dtype":
            shape.add_argument(flag, choices=["float32", "bfloat16", "float16"], help=defaults)
        else:
            shape.add_argument(flag, type=int, help=defaults)
    args = parser.parse_args()
    if args.cuda:
        import torch
        if not torch.cuda.is_available():
            parser.error("--cuda: torch sees no CUDA device here")
        if args.engines and set(args.engines) != {"transformers"}:
            parser.error("--cuda runs the transformers backend only (no vLLM on that machine)")
    args.engines = args.engines or (["transformers"] if args.cuda else list(ENGINES))
    base = CUDA_SHAPE if args.cuda else CPU_SHAPE
    args.shape = Shape(**{item.name: getattr(args, item.name) if getattr(args, item.name) is not None
                          else getattr(base, item.name) for item in fields(Shape)})
    if args.max_tokens + len(args.prompt) + 8 > args.shape.context:
        parser.error(f"--max-tokens {args.max_tokens} and the prompt do not fit a context of {args.shape.context}")
    if min(args.concurrency) < 1 or args.requests < 0 or args.rounds < 1 or args.slices < 1 \
            or args.duration < 0:
        parser.error("concurrency, --rounds and --slices must be at least 1, --requests and --duration not "
                     "negative")
    args.max_num_seqs = args.max_num_seqs or max(args.concurrency)
    args.work_dir = args.work_dir.resolve()
    return args


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind, so that a running server is stopped
    RESULTS.mkdir(parents=True, exist_ok=True)
    started = datetime.now()
    stem = f"llm-{started:%Y%m%d-%H%M%S}"
    model_dir = args.weights.resolve() if args.weights else make_model(args.shape, args.work_dir / "models")
    parameters = model_parameters(model_dir)
    print(f"model: {model_dir} ({fmt(parameters and parameters / 1e6)}M parameters)", flush=True)
    uptime, load = load_line()
    print(uptime, flush=True)
    if load[0] >= 0.5 * (os.cpu_count() or 1):
        print(f"warning: load {load[0]:.2f} on {os.cpu_count()} CPUs before the start: figures will be noisy",
              flush=True)
    cells: list[Cell] = []
    loads: dict[str, dict[str, Any]] = {"start": {"uptime": uptime, "load": list(load)}}
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner, contextlib.ExitStack() as stack:
        servers = start_servers(model_dir, args.shape, args, stem, stack)
        for concurrency in args.concurrency:
            uptime, level_load = load_line()
            print(f"\nc={concurrency}: {uptime}", flush=True)
            loads[f"c={concurrency}"] = {"uptime": uptime, "load": list(level_load)}
            cells += measure_level(servers, concurrency, args, runner)
    reference = "vllm-server"
    if args.cuda:
        cells += generate_cells(model_dir, args.shape, args, "cuda")
        reference = GENERATE
    count = (f"{args.duration:g} s" if args.duration
             else f"{args.requests}" if args.requests else f"{args.rounds} x c")
    header = (f"## LLM serving, {started:%Y-%m-%d %H:%M}, {os.cpu_count()} CPUs, {platform.platform()}\n\n"
              f"Model: {model_dir.name} ({fmt(parameters and parameters / 1e6)}M parameters). Streaming "
              f"/v1/completions, prompt {args.prompt!r}, max_tokens {args.max_tokens}, temperature 0, ignore_eos, "
              f"{count} requests per cell in {args.slices} slices, the servers taking turns; "
              f"load before the start {' '.join(f'{value:.2f}' for value in load)}")
    table = markdown(cells, reference, header)
    compared = comparisons(cells, reference)
    record = {"bench": "run_llm", "started": started.isoformat(timespec="seconds"), "machine": platform.platform(),
              "cpus": os.cpu_count(), "model": {"path": str(model_dir), "parameters": parameters,
                                                **({} if args.weights else asdict(args.shape))},
              "settings": {"engines": args.engines, "concurrency": args.concurrency, "requests": args.requests,
                           "rounds": args.rounds, "slices": args.slices,
                           "duration_s": args.duration, "max_tokens": args.max_tokens, "prompt": args.prompt,
                           "warmup_tokens": args.warmup_tokens, "max_num_seqs": args.max_num_seqs,
                           "cuda": args.cuda},
              "reference": reference, "load_before": loads,
              "cells": [{**asdict(cell), **compared.get((cell.engine, cell.concurrency), {})} for cell in cells]}
    (RESULTS / f"{stem}.md").write_text(table)
    (RESULTS / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")
    print("\n" + table + f"\nwritten: {RESULTS / stem}.md and .json (server logs beside them)\n")
    print(json.dumps(record), flush=True)
    return 0 if all(cell.ok and not cell.failed for cell in cells) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the server was stopped on the way out
        sys.exit(130)
