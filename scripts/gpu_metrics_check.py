"""The GPU metrics check of scripts/gpu_check.sh: a real server's nv_gpu_* metrics match what NVML says.

Starts ``triton-serve`` (empty model repository, metrics polled every 250 ms), scrapes /metrics and checks,
for every GPU that NVML lists: each of the six GPU families (``nv_gpu_utilization``,
``nv_gpu_memory_total_bytes``, ``nv_gpu_memory_used_bytes``, ``nv_gpu_power_usage``, ``nv_gpu_power_limit``,
``nv_energy_consumption``) has a sample labelled with its ``gpu_uuid``; total memory and the power limit
equal NVML's; utilization lies in [0, 1]; the energy counter does not go back. Where torch can use CUDA it
then takes 2 GiB on GPU 0 and checks that ``nv_gpu_memory_used_bytes`` of that GPU rose by at least that.
Without a GPU or nvidia-ml-py it checks that no GPU family is exported and exits 77 (skipped).
Exit status: 0 passed, 1 failed, 77 skipped; the last line says why.
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from triton_serve.testing import free_port

FAMILIES = ("nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes", "nv_gpu_power_usage",
            "nv_gpu_power_limit", "nv_energy_consumption")
SKIPPED = 77
GIB = 1 << 30


def nvml_devices() -> tuple[dict[str, tuple[int, float]], str]:
    """{uuid: (total memory bytes, enforced power limit W)} from NVML, or ({}, why not)."""
    try:
        import pynvml
    except ImportError:
        return {}, "nvidia-ml-py (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return {}, f"NVML did not start: {error}"
    try:
        devices = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            devices[uuid] = (int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                             pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000)
        return devices, "" if devices else "NVML lists no GPU"
    finally:
        pynvml.nvmlShutdown()


def samples(text: str, family: str) -> dict[str, float]:
    """{gpu_uuid: value} of one family in a Prometheus text exposition."""
    pattern = rf'^{family}\{{gpu_uuid="([^"]+)"\}} (\S+)$'
    return {uuid: float(value) for uuid, value in re.findall(pattern, text, re.MULTILINE)}


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return str(answer.read().decode())


def start_server(repository: str, metrics_port: int) -> subprocess.Popen[bytes]:
    http_port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "triton_serve", f"--model-repository={repository}",
         f"--http-port={http_port}", f"--grpc-port={free_port()}", f"--metrics-port={metrics_port}",
         "--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--frontend-processes=0",
         "--metrics-interval-ms=250"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 90
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/live", timeout=5) as answer:
                if answer.status == 200:
                    return process
        except (urllib.error.URLError, OSError):
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"FAIL: the server did not start (exit status {process.poll()})")
        time.sleep(0.2)


def check(port: int, devices: dict[str, tuple[int, float]]) -> list[str]:
    """What is wrong with the GPU families (empty: all good)."""
    problems = []
    first = scrape(port)
    time.sleep(1.0)
    second = scrape(port)
    for family in FAMILIES:
        kind = "counter" if family == "nv_energy_consumption" else "gauge"
        if f"# TYPE {family} {kind}\n" not in second:
            problems.append(f"no '# TYPE {family} {kind}'")
        got = samples(second, family)
        if set(got) != set(devices):
            problems.append(f"{family} has gpu_uuid {sorted(got)}, NVML lists {sorted(devices)}")
    for uuid, (total, power_limit) in devices.items():
        if samples(second, "nv_gpu_memory_total_bytes").get(uuid) != total:
            problems.append(f"{uuid}: nv_gpu_memory_total_bytes is not NVML's {total}")
        if abs(samples(second, "nv_gpu_power_limit").get(uuid, -1) - power_limit) > 1e-6:
            problems.append(f"{uuid}: nv_gpu_power_limit is not NVML's {power_limit} W")
        if not 0 <= samples(second, "nv_gpu_utilization").get(uuid, -1) <= 1:
            problems.append(f"{uuid}: nv_gpu_utilization is outside [0, 1]")
        before, after = (samples(text, "nv_energy_consumption").get(uuid, -1) for text in (first, second))
        if not 0 <= before <= after:
            problems.append(f"{uuid}: nv_energy_consumption went from {before} to {after}")
    return problems


def memory_follows_an_allocation(port: int) -> str:
    """'' if nv_gpu_memory_used_bytes of GPU 0 rose by 2 GiB once torch took them; else what went wrong."""
    try:
        import torch
    except ImportError:
        return "skipped: torch is not installed"
    if not torch.cuda.is_available():
        return "skipped: torch cannot use CUDA"
    import pynvml

    pynvml.nvmlInit()
    try:
        uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(0))
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    finally:
        pynvml.nvmlShutdown()
    torch.empty(1, device="cuda:0")  # the CUDA context first: its own memory is not the allocation measured
    time.sleep(1.0)
    before = samples(scrape(port), "nv_gpu_memory_used_bytes")[uuid]
    block = torch.empty(2 * GIB, dtype=torch.uint8, device="cuda:0")
    block.fill_(1)
    torch.cuda.synchronize()
    time.sleep(1.0)
    after = samples(scrape(port), "nv_gpu_memory_used_bytes")[uuid]
    del block
    if after - before < 2 * GIB:
        return f"nv_gpu_memory_used_bytes rose by {after - before:.0f} bytes after torch took 2 GiB"
    return ""


def main() -> int:
    devices, why_not = nvml_devices()
    metrics_port = free_port()
    with tempfile.TemporaryDirectory() as repository:
        process = start_server(repository, metrics_port)
        try:
            if not devices:
                text = scrape(metrics_port)
                if "nv_gpu_" in text or "nv_energy_consumption" in text:
                    print(f"FAIL: {why_not}, yet GPU families are exported")
                    return 1
                print(f"SKIP: {why_not}; checked only that no GPU family is exported")
                return SKIPPED
            problems = check(metrics_port, devices)
            if not problems:
                allocation = memory_follows_an_allocation(metrics_port)
                if allocation and not allocation.startswith("skipped"):
                    problems.append(allocation)
            if problems:
                print("FAIL: " + "; ".join(problems))
                return 1
            print(f"PASS: {len(FAMILIES)} GPU families for {len(devices)} GPU(s) match NVML"
                  + (f"; memory allocation: {allocation}" if allocation else
                     "; used memory rose by 2 GiB when torch took them"))
            return 0
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


if __name__ == "__main__":
    raise SystemExit(main())
