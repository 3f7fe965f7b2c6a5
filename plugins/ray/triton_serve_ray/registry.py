"""Where each model's replicas listen: a named Ray actor that replicas report to and front doors read."""
from __future__ import annotations

import time

import ray
from ray.actor import ActorHandle

HEARTBEAT_S = 0.5  # how often a replica reports its address
LEASE_S = 3.0  # an address not reported for this long is dropped (its replica died without leaving)
NAMESPACE = "triton_serve_ray"
HEAD_NODE = "node:__internal_head__"  # the resource Ray gives the head node only


@ray.remote(num_cpus=0)
class ReplicaRegistry:
    """Model name -> the channel addresses (``host:port``) of its live replicas. A replica reports its
    address every ``HEARTBEAT_S`` while it serves and leaves when Ray stops it; one killed outright
    stops reporting and is dropped after ``LEASE_S``."""

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], float] = {}

    def heartbeat(self, model: str, address: str) -> None:
        self._seen[(model, address)] = time.monotonic()

    def leave(self, model: str, address: str) -> None:
        self._seen.pop((model, address), None)

    def replicas(self) -> dict[str, list[str]]:
        expired = time.monotonic() - LEASE_S
        self._seen = {key: seen for key, seen in self._seen.items() if seen >= expired}
        table: dict[str, list[str]] = {}
        for model, address in sorted(self._seen):
            table.setdefault(model, []).append(address)
        return table


def registry_of(app: str) -> ActorHandle:
    """The registry of application ``app``, created by whichever replica asks first. Detached: it outlives the
    replica that created it (replicas come and go), and goes with the cluster. On the head node, which stays
    while the cluster does (one on a node that left would take the routing table with it, and the front doors
    would keep routing to what they last read); restarted if its process dies, the replicas' reports fill it
    again."""
    return ReplicaRegistry.options(  # type: ignore[attr-defined]
        name=f"registry:{app}", namespace=NAMESPACE, get_if_exists=True, lifetime="detached",
        resources={HEAD_NODE: 0.001}, scheduling_strategy="DEFAULT", max_restarts=-1).remote()
