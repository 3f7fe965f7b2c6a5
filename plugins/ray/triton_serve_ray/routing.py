"""The front door's data plane: the data-plane seam forwarded over the binary channel straight to a replica of the
model's deployment (one hop), with the replicas' addresses from the registry."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import triton_serve
from triton_serve.plugin import (ForwardingDataPlane, InferenceRequest, InferenceResponse, RemoteDataPlane, ServerError,
                                 Status)

from .statistics import summed

log = logging.getLogger("triton_serve_ray")

# What works through the front door: no shared memory (the client and the replicas need not share a host).
EXTENSIONS = ["classification", "model_repository", "model_configuration", "binary_tensor_data", "parameters",
              "statistics"]
# Triton's answer to load / unload when models are not under explicit control: a deployment's models are fixed.
CONTROL_DISABLED = "explicit model load / unload is not allowed if polling is enabled"
SHARED_MEMORY = ("shared memory is not supported through Ray Serve: the client and the model replicas need not "
                 "share a host")


def not_served(what: str) -> str:
    return f"{what} is not supported through Ray Serve: each model replica is a server of its own"


# The seam's calls that are not forwarded, and the error each answers instead: one replica cannot act for the
# deployment (load a model, register a region on its host, change its logging or tracing).
REFUSED: dict[str, tuple[str, Status]] = {
    "load_model": (CONTROL_DISABLED, Status.UNAVAILABLE),
    "unload_model": (CONTROL_DISABLED, Status.UNAVAILABLE),
    "register_system_shared_memory": (SHARED_MEMORY, Status.UNSUPPORTED),
    "register_cuda_shared_memory": (SHARED_MEMORY, Status.UNSUPPORTED),
    "shared_memory_status": (SHARED_MEMORY, Status.UNSUPPORTED),
    "unregister_shared_memory": (SHARED_MEMORY, Status.UNSUPPORTED),
    "log_settings": (not_served("the logging extension"), Status.UNSUPPORTED),
    "update_log_settings": (not_served("the logging extension"), Status.UNSUPPORTED),
    "trace_setting": (not_served("the trace extension"), Status.UNSUPPORTED),
    "metrics_text": (not_served("a metrics text for the deployment"), Status.UNSUPPORTED),
}

ATTEMPTS = 3  # replicas a request or call is sent to before it is answered UNAVAILABLE
REFRESH_S = 0.5  # how often the routing table is read from the registry
REPLICA_WAIT_S = 10.0  # how long a request waits for its model to have a live replica (one being replaced)
CONNECT_TIMEOUT_S = 5.0
POLL_S = 0.05

TableSource = Callable[[], Awaitable[dict[str, list[str]]]]


class Replica:
    """One replica's channel (a ``RemoteDataPlane`` over TCP) and the requests it holds now."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.link = RemoteDataPlane(f"the replica at {address} went away during the request")
        self.connected = False
        self.outstanding = 0

    @property
    def alive(self) -> bool:
        return self.connected and not self.link.lost.is_set()

    async def connect(self) -> None:
        host, port = self.address.rsplit(":", 1)
        await asyncio.wait_for(self.link.connect_tcp(host, int(port)), CONNECT_TIMEOUT_S)
        self.connected = True


def no_replica(model: str, why: str) -> ServerError:
    return ServerError(f"model '{model}' is unavailable: {why}", Status.UNAVAILABLE)


class ChannelDataPlane(ForwardingDataPlane):
    """The seam the front door's HTTP and gRPC front-ends call. A call or request naming a model goes to the
    live replica of that model holding the fewest requests (among equals, each in turn); one naming none to a
    replica of every model, the answers joined; statistics to every live replica, summed; those ``REFUSED``
    are refused. A request whose replica's channel closes before it
    answered (the replica died) is sent to another replica, ``ATTEMPTS`` replicas in all, then answered
    UNAVAILABLE; one that already streamed responses is answered UNAVAILABLE at once.

    ``start()`` begins reading the routing table (model -> replica addresses) from ``table`` every
    ``REFRESH_S``; ``stop()`` ends it. Runs on one event loop.
    """

    def __init__(self, models: list[str], server_id: str, table: TableSource) -> None:
        self.models = sorted(models)
        self.server_id = server_id
        self.trace_armed = False  # each replica is a server of its own: no tracing through the front door
        self.accepting = True
        self._table = table
        self._routes: dict[str, list[Replica]] = {}
        self._replicas: dict[str, Replica] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._refresher: asyncio.Task[None] | None = None
        self._turn = 0  # rotates the choice among equally loaded replicas

    # ---- the routing table ----------------------------------------------------------------------

    async def start(self) -> None:
        await self.refresh()
        self._refresher = asyncio.get_running_loop().create_task(self._refresh_forever())

    def stop(self) -> None:
        """Stop reading the table and close every replica's channel."""
        if self._refresher is not None:
            self._refresher.cancel()
        for replica in self._replicas.values():
            replica.link.close()
        self._replicas.clear()

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            try:
                await self.refresh()
            except Exception as error:  # the registry is being restarted: keep the table until it answers
                log.warning("could not read the replicas' addresses: %s", error)

    async def refresh(self) -> None:
        """Read the table; connect to replicas new in it (or whose channel closed), close those gone from it."""
        table = await self._table()
        listed = {address for addresses in table.values() for address in addresses}
        for address in listed & set(self._replicas):  # a channel that closed is opened again while listed
            if self._replicas[address].link.lost.is_set():
                del self._replicas[address]
        for address in listed - set(self._replicas):
            replica = self._replicas[address] = Replica(address)
            self._spawn(self._connect(replica))
        for address in set(self._replicas) - listed:  # dead, or stopping: its requests in flight go elsewhere
            self._replicas.pop(address).link.close()
        self._routes = {model: [self._replicas[address] for address in table.get(model, [])] for model in self.models}

    async def _connect(self, replica: Replica) -> None:
        try:
            await replica.connect()
        except (OSError, asyncio.TimeoutError) as error:
            log.warning("replica at %s: could not connect: %s", replica.address, error)
            if self._replicas.get(replica.address) is replica:
                del self._replicas[replica.address]  # tried again if the registry still lists it
            return
        if self._replicas.get(replica.address) is not replica:  # gone from the table (or stopped) meanwhile
            replica.link.close()

    def _spawn(self, coroutine: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _pick(self, model: str, tried: frozenset[str]) -> Replica | None:
        """The live replica holding the fewest requests; among equals, each in turn."""
        live = [replica for replica in self._routes.get(model, ()) if replica.alive and replica.address not in tried]
        if not live:
            return None
        self._turn += 1
        start = self._turn % len(live)
        return min(live[start:] + live[:start], key=lambda replica: replica.outstanding)

    async def _replica_for(self, model: str, tried: frozenset[str] = frozenset(),
                           wait_s: float = REPLICA_WAIT_S) -> Replica:
        """A live replica of ``model`` not in ``tried``, waiting up to ``wait_s`` for one to appear."""
        if model not in self.models:
            raise ServerError(f"Request for unknown model: '{model}' is not found", Status.NOT_FOUND)
        deadline = asyncio.get_running_loop().time() + wait_s
        while (replica := self._pick(model, tried)) is None:
            if asyncio.get_running_loop().time() >= deadline:
                raise no_replica(model, f"no live replica within {wait_s:g} s")
            await asyncio.sleep(POLL_S)
        return replica

    # ---- calls ----------------------------------------------------------------------------------

    async def forward(self, method: str, arguments: dict[str, Any]) -> Any:
        """Refuse the call, or send it to a replica of the model it names, or of every model that has a live
        replica (joined; the repository index lists the others UNAVAILABLE)."""
        refused = REFUSED.get(method)
        if refused is not None:
            raise ServerError(*refused)
        if arguments.get("name"):
            return await self._call(arguments["name"], method, arguments)
        served = [model for model in self.models if self._pick(model, frozenset()) is not None]
        answers = await asyncio.gather(*(self._call(model, method, arguments) for model in served))
        answer = joined(method, dict(zip(served, answers)))
        if method == "repository_index" and not arguments["ready_only"]:  # the models without a replica now
            answer += [{"name": model, "state": "UNAVAILABLE", "reason": "no live replica"}
                       for model in self.models if model not in served]
            answer.sort(key=lambda entry: entry["name"])
        return answer

    async def _call(self, model: str, method: str, arguments: dict[str, Any]) -> Any:
        tried: frozenset[str] = frozenset()
        while True:
            replica = await self._replica_for(model, tried)
            try:
                return await replica.link.forward(method, arguments)
            except ServerError:
                if replica.alive:
                    raise  # the replica's own answer
                tried |= {replica.address}
                if len(tried) >= ATTEMPTS:
                    raise no_replica(model, f"{ATTEMPTS} replicas went away during '{method}'") from None

    async def model_statistics(self, name: str = "", version: int | None = None) -> list[dict[str, Any]]:
        """Triton's statistics of the deployment: each model version's counters summed over every live replica
        of its model (``statistics.summed``); without a name, those of every model with a live replica."""
        if name:
            return await self._summed_statistics(name, version)
        if version is not None:
            raise ServerError("statistics for a model version need the model name")
        served = [model for model in self.models if self._pick(model, frozenset()) is not None]
        answers = await asyncio.gather(*(self._summed_statistics(model, None) for model in served))
        return [entry for answer in answers for entry in answer]

    async def _summed_statistics(self, model: str, version: int | None) -> list[dict[str, Any]]:
        """``model``'s statistics from each of its live replicas (waiting for one when none is), summed; a
        replica that goes away meanwhile is left out, its counts with it."""
        replicas = [replica for replica in self._routes.get(model, ()) if replica.alive]
        if not replicas:
            replicas = [await self._replica_for(model)]
        arguments = {"name": model, "version": version}
        answers = await asyncio.gather(*(replica.link.forward("model_statistics", arguments) for replica in replicas),
                                       return_exceptions=True)
        kept = []
        for replica, answer in zip(replicas, answers):
            if not isinstance(answer, BaseException):
                kept.append(answer)
            elif not isinstance(answer, ServerError) or replica.alive:
                raise answer  # the replica's own answer (an unknown version...)
        if not kept:
            raise no_replica(model, "its replicas went away during 'model_statistics'")
        return summed(kept)

    async def live(self) -> bool:
        return True

    async def server_ready(self) -> bool:
        """Every deployed model has a live replica that reports it ready."""
        return self.accepting and all(await asyncio.gather(*(self.model_ready(model) for model in self.models)))

    async def server_metadata(self) -> dict[str, Any]:
        return {"name": self.server_id, "version": triton_serve.__version__, "extensions": list(EXTENSIONS)}

    async def model_ready(self, name: str, version: int | None = None) -> bool:
        """False for a model that is not deployed or has no live replica now; else its replica's answer."""
        try:
            replica = await self._replica_for(name, wait_s=0)
            return bool(await replica.link.forward("model_ready", {"name": name, "version": version}))
        except ServerError:
            return False

    # ---- inference ------------------------------------------------------------------------------

    def submit(self, request: InferenceRequest, *, decoupled_error: str | None = None) -> None:
        """Send ``request`` to a replica of its model; its responses come back through ``request.send``."""
        if request.model_name not in self.models:
            raise ServerError(f"Request for unknown model: '{request.model_name}' is not found", Status.NOT_FOUND)
        self._route(request, decoupled_error, frozenset())

    def _route(self, request: InferenceRequest, decoupled_error: str | None, tried: frozenset[str]) -> None:
        replica = self._pick(request.model_name, tried)
        if replica is not None:
            self._send(replica, request, decoupled_error, tried)
        else:
            self._spawn(self._route_when_live(request, decoupled_error, tried))

    async def _route_when_live(self, request: InferenceRequest, decoupled_error: str | None,
                               tried: frozenset[str]) -> None:
        try:
            replica = await self._replica_for(request.model_name, tried)
        except ServerError as error:
            request.fail(error)
            return
        if not request.cancelled.is_set():
            self._send(replica, request, decoupled_error, tried)

    def _send(self, replica: Replica, request: InferenceRequest, decoupled_error: str | None,
              tried: frozenset[str]) -> None:
        """One attempt: a request of the same content (its own response channel) on ``replica``'s link, whose
        responses are passed on to ``request``, unless the link closes before the first one: then another attempt."""
        attempt = InferenceRequest.from_content(request.content)
        answered = False
        loop = asyncio.get_running_loop()

        def retry_or_answer(response: InferenceResponse) -> None:
            if not replica.link.lost.is_set() or request.cancelled.is_set():
                request.model_version = attempt.model_version
                request.send(response)
                return
            now_tried = tried | {replica.address}
            if len(now_tried) >= ATTEMPTS:
                request.fail(no_replica(request.model_name, f"{ATTEMPTS} replicas went away during the request"))
                return
            log.warning("model '%s': replica %s went away; sending the request to another", request.model_name,
                        replica.address)
            self._route(request, decoupled_error, now_tried)

        def sink(response: InferenceResponse | None, final: bool) -> None:
            nonlocal answered
            if final:
                replica.outstanding -= 1
            if not answered and final and response is not None and response.error is not None:
                # The link closes by failing its requests, then marking itself lost: decide once it has.
                loop.call_soon(retry_or_answer, response)
                return
            answered = True
            request.model_version = attempt.model_version
            request.send(response, final=final)

        attempt.set_sink(sink)
        replica.outstanding += 1
        try:
            replica.link.submit(attempt, decoupled_error=decoupled_error)
        except ServerError:  # the link closed a moment ago
            replica.outstanding -= 1
            self._route(request, decoupled_error, tried | {replica.address})
            return
        request.on_cancel = attempt.cancel


def joined(method: str, answers: dict[str, Any]) -> Any:
    """One answer from every deployment's answer to a call that names no model. Each replica answers for its
    whole server, whose repository holds the other models too (and an ensemble's replica loads its steps):
    of a list of entries (the repository index), each deployment's own model's entries are kept. Any other
    answer must be the same from every deployment."""
    values = list(answers.values())
    if all(isinstance(value, list) for value in values):
        return [entry for model, value in answers.items() for entry in value if entry.get("name") == model]
    if any(value != values[0] for value in values):
        raise ServerError(f"the model deployments answered '{method}' differently", Status.INTERNAL)
    return values[0] if values else None
