"""A Ray cluster of several nodes on one machine, each node started with ``ray start --block`` (its own CPUs,
resources and loopback address) and stopped with it: a multi-node deployment tried without more machines."""
from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

STARTED = "Ray runtime started"  # what `ray start` prints once its node runs
STOP_TIMEOUT_S = 30.0  # how long a node gets to stop its processes after SIGTERM before they are killed
POLL_S = 0.2
PR_SET_PDEATHSIG = 1  # prctl's option: the signal a process gets when its parent exits
OUTPUT_LINES = 20  # of a node's output and of the GCS log, in the error when a node fails to start
# No usage report; no token authentication between the nodes (all on loopback): with a token in ~/.ray and no
# RAY_AUTH_MODE, `ray start --head` would require one, and `ray start --address` would not send it. No drain on
# SIGTERM (up to 30 s by default, for a node leaving a cluster that stays): the whole cluster stops.
NODE_ENVIRONMENT = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
                    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}


@dataclass(frozen=True)
class NodeSpec:
    """One node: what Ray may schedule on it, and its address: None for the machine's own (the head's: Ray
    gives a head on a loopback address the machine's), else a loopback address of its own (127.0.0.2,
    127.0.0.3...), which tells the node's actors apart from the others'."""

    num_cpus: float
    resources: dict[str, float] = field(default_factory=dict)
    ip: str | None = None


class ClusterFailed(RuntimeError):
    """A node exited or did not start in time."""


def _die_with_starter() -> None:
    """In a node's ``ray start`` before it runs (Linux): SIGTERM when the process that started it exits, even
    killed, so that no node outlives its cluster's owner."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _signal(pid: int, number: signal.Signals) -> None:
    try:
        os.kill(pid, number)
    except ProcessLookupError:  # exited meanwhile
        pass


def _tail(text: str) -> str:
    return "\n".join(text.strip().splitlines()[-OUTPUT_LINES:])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalCluster:
    """The head (the first of ``nodes``) and the other nodes, each a ``ray start --block`` process of its own
    session, with a temporary directory of their own. ``start()`` returns when every node has started (each within
    ``start_timeout_s`` of its launch: a head slowed by a busy machine leaves the next node its full time), or
    raises ``ClusterFailed`` with the end of the failed node's output; ``stop()`` stops them (SIGTERM, on which
    ``ray start`` stops its node's processes; what is left after ``STOP_TIMEOUT_S`` is killed) and never touches
    another cluster of the machine (no ``ray stop``). A node gets SIGTERM too when the process that started it
    exits. A driver of this machine connects with ``ray.init(address=cluster.address)``."""

    def __init__(self, nodes: list[NodeSpec], object_store_bytes: int = 100 * 1024 * 1024,
                 start_timeout_s: float = 120.0) -> None:
        if not nodes:
            raise ValueError("a cluster needs a head node")
        self.nodes = nodes
        self.object_store_bytes = object_store_bytes
        self.start_timeout_s = start_timeout_s
        self.address = f"127.0.0.1:{free_port()}"  # the head's GCS
        self.temp_dir = Path(tempfile.mkdtemp(prefix="ray"))  # short: Ray's socket paths live under it
        self.processes: list[subprocess.Popen[bytes]] = []

    def _command(self, node: NodeSpec, head: bool) -> list[str]:
        ray = Path(sys.executable).with_name("ray")
        command = [str(ray) if ray.exists() else "ray", "start", "--block", f"--num-cpus={node.num_cpus:g}",
                   f"--resources={json.dumps(node.resources)}", f"--object-store-memory={self.object_store_bytes}",
                   f"--temp-dir={self.temp_dir}", f"--dashboard-agent-listen-port={free_port()}",
                   "--disable-usage-stats"]
        if node.ip is not None:
            command.append(f"--node-ip-address={node.ip}")
        if head:
            return [*command, "--head", f"--port={self.address.rsplit(':', 1)[1]}", "--include-dashboard=false",
                    f"--ray-client-server-port={free_port()}"]
        return [*command, f"--address={self.address}"]

    def log_of(self, number: int) -> Path:
        return self.temp_dir / f"node{number}.log"

    def start(self) -> LocalCluster:
        try:
            for number, node in enumerate(self.nodes):
                with open(self.log_of(number), "wb") as log:
                    self.processes.append(subprocess.Popen(
                        self._command(node, head=number == 0), stdin=subprocess.DEVNULL, stdout=log,
                        stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_die_with_starter,
                        env={**os.environ, **NODE_ENVIRONMENT}))
                self._wait_started(number, self.processes[-1], time.monotonic() + self.start_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_started(self, number: int, process: subprocess.Popen[bytes], deadline: float) -> None:
        while STARTED not in (output := self.log_of(number).read_text(errors="replace")):
            if process.poll() is not None:
                why = f"exited with status {process.returncode} before it started"
            elif time.monotonic() > deadline:
                why = f"did not start within {self.start_timeout_s:g} s"
            else:
                time.sleep(POLL_S)
                continue
            name = "head" if number == 0 else f"node {number} ({self.nodes[number].ip or 'this machine'})"
            message = f"the Ray {name} {why}; the end of its output:\n{_tail(output)}"
            gcs_log = self.temp_dir / "session_latest" / "logs" / "gcs_server.out"
            if gcs_log.is_file():  # the head's GCS, which every node joins through
                gcs_output = gcs_log.read_text(errors="replace")
                message += f"\nthe end of the head's GCS log ({gcs_log.name}):\n{_tail(gcs_output)}"
            raise ClusterFailed(message)

    def freeze_node(self, number: int) -> None:
        """Stop every process of node ``number`` (not the head) where it stands (SIGSTOP), as a machine that stops
        answering without closing its connections; ``kill_node`` it afterwards."""
        for pid in self._node_processes(number):
            _signal(pid, signal.SIGSTOP)

    def kill_node(self, number: int) -> int:
        """Kill every process of node ``number`` (not the head) at once (SIGKILL), as a machine lost; the other
        nodes stay. Returns its ``ray start``'s exit status."""
        for pid in self._node_processes(number):
            _signal(pid, signal.SIGKILL)
        return self.processes[number].wait(STOP_TIMEOUT_S)

    def _node_processes(self, number: int) -> list[int]:
        """Node ``number``'s ``ray start`` and every process under it (Ray's workers have process groups of
        their own), the parents first."""
        if number == 0:
            raise ValueError("the head holds the cluster: stop() the cluster instead")
        children: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:  # exited meanwhile
                continue
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        found = [self.processes[number].pid]
        for pid in found:  # grows while it is walked: breadth first
            found.extend(children.get(pid, []))
        return found

    def stop(self) -> list[int | None]:
        """Stop the nodes, the others before the head; each one's exit status (None: it had to be killed)."""
        statuses: list[int | None] = []
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                statuses.append(process.wait(STOP_TIMEOUT_S))
            except subprocess.TimeoutExpired:
                statuses.append(None)
            try:  # whatever the node started and left behind, in its session
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait(STOP_TIMEOUT_S)
        self.processes.clear()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return statuses[::-1]

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()
