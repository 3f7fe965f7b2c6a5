"""Triton's shared-memory registry: regions clients register by name, mapped once and used by requests."""
from __future__ import annotations

import logging
import mmap
import os
import stat
from abc import ABC, abstractmethod
from typing import Any

from .errors import ServerError, Status, internal, not_found

log = logging.getLogger(__name__)

SYSTEM = "system"
CUDA = "cuda"
# Where Linux keeps POSIX shared-memory objects: shm_open("/key") opens SHM_DIRECTORY/key.
SHM_DIRECTORY = "/dev/shm"
_KIND_TEXT = {SYSTEM: "system", CUDA: "CUDA"}
# Triton's answer (UNSUPPORTED: HTTP 501, gRPC UNIMPLEMENTED) to a register or unregister under
# --allow-client-shm=false
CLIENT_SHM_DISABLED = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."


class Region(ABC):
    """A registered window of memory that requests read inputs from and write outputs into.

    ``users`` counts the requests holding it; while it is not zero the region cannot be unregistered
    (as in Triton 2.51), so its memory stays mapped under every request using it. Subclasses map the
    memory: ``SystemRegion`` here, ``CudaRegion`` in ``cuda_memory.py``. Every method runs on the
    server's event loop.
    """

    kind: str  # SYSTEM or CUDA

    def __init__(self, name: str, byte_size: int) -> None:
        self.name = name
        self.byte_size = byte_size
        self.users = 0

    @abstractmethod
    def status(self) -> dict[str, Any]:
        """Triton's status entry for the region."""

    @abstractmethod
    def read(self, offset: int, byte_size: int) -> memoryview:
        """``byte_size`` bytes at ``offset`` (checked with ``check_window``)."""

    @abstractmethod
    def write(self, offset: int, data: memoryview) -> None:
        """Copy ``data`` (bytes) to ``offset`` (checked with ``check_window``)."""

    @abstractmethod
    def close(self) -> None:
        """Release the memory (no request uses the region any more)."""

    def check_window(self, offset: int, byte_size: int) -> None:
        """A request's offset and size must lie inside the region (Triton's messages)."""
        if not 0 <= offset < self.byte_size:
            raise ServerError(f"Invalid offset for shared memory region: '{self.name}'")
        if byte_size < 0 or offset + byte_size > self.byte_size:
            raise ServerError(f"Invalid offset + byte size for shared memory region: '{self.name}'")

    def acquire(self) -> None:
        self.users += 1

    def release(self) -> None:
        self.users -= 1


class SystemRegion(Region):
    """A window of a POSIX shared-memory object, mapped once at registration.

    The object's descriptor stays open, so every use can check that the client has not deleted or
    shrunk it (touching mapped pages past the end of a shrunk object would raise SIGBUS).
    """

    kind = SYSTEM

    def __init__(self, name: str, key: str, offset: int, byte_size: int) -> None:
        super().__init__(name, byte_size)
        self.key = key
        self.offset = offset
        self._fd = _open_object(name, key)
        try:
            size = os.fstat(self._fd).st_size
            if offset < 0 or byte_size <= 0 or offset + byte_size > size:
                raise ServerError(f"failed to register shared memory region '{name}': invalid args (offset {offset} "
                                  f"and byte_size {byte_size} do not fit the {size} bytes of '{key}')")
            start = offset - offset % mmap.ALLOCATIONGRANULARITY  # mmap offsets are page aligned
            self._map = mmap.mmap(self._fd, offset - start + byte_size, offset=start)
        except BaseException:
            os.close(self._fd)
            raise
        self._base = offset - start

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def read(self, offset: int, byte_size: int) -> memoryview:
        self._check_object()
        start = self._base + offset
        return memoryview(self._map)[start:start + byte_size]

    def write(self, offset: int, data: memoryview) -> None:
        self._check_object()
        start = self._base + offset
        self._map[start:start + len(data)] = data

    def close(self) -> None:
        try:
            self._map.close()
        except BufferError:  # arrays still view the memory: it is unmapped when the last one goes
            log.debug("shared memory region '%s' stays mapped until its arrays are released", self.name)
        os.close(self._fd)

    def _check_object(self) -> None:
        info = os.fstat(self._fd)
        if info.st_nlink == 0:
            raise ServerError(f"shared memory region '{self.name}' is unusable: its key '{self.key}' was deleted "
                              "while registered; unregister the region")
        if info.st_size < self.offset + self.byte_size:
            raise ServerError(f"shared memory region '{self.name}' is unusable: '{self.key}' shrank to "
                              f"{info.st_size} bytes while registered; unregister the region")


def _open_object(name: str, key: str) -> int:
    """Open a POSIX shared-memory object as shm_open does: one name under SHM_DIRECTORY, never a path
    elsewhere (no '/' past the leading ones, no NUL), a regular file, and not through a symbolic link."""
    bare = key.lstrip("/")
    error = f"Unable to open shared memory region: '{key}' (registering '{name}'"
    if not bare or "/" in bare or "\0" in bare:
        raise ServerError(f"{error}: not a shared memory key)", Status.INTERNAL)
    try:
        fd = os.open(os.path.join(SHM_DIRECTORY, bare), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as failure:
        raise ServerError(f"{error}: {failure.strerror})", Status.INTERNAL) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ServerError(f"{error}: not a shared memory object)", Status.INTERNAL)
    return fd


class SharedMemoryRegistry:
    """The regions registered with this server, system and CUDA in one namespace, as in Triton.

    Lives in the model owner; front-end processes reach it through the data plane.
    """

    def __init__(self, allow_client: bool = True) -> None:
        self._regions: dict[str, Region] = {}
        # --allow-client-shm (Triton 2.69): false refuses every register and unregister
        self.allow_client = allow_client

    def _check_allowed(self) -> None:
        if not self.allow_client:
            raise ServerError(CLIENT_SHM_DISABLED, Status.UNSUPPORTED)

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._check_allowed()
        self._check_new(name)
        self._add(SystemRegion(name, key, offset, byte_size))

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self._check_allowed()
        self._check_new(name)
        from .cuda_memory import CudaRegion  # imports no CUDA library until a region is registered
        self._add(CudaRegion(name, raw_handle, device_id, byte_size))

    def _check_new(self, name: str) -> None:
        if name in self._regions:
            raise ServerError(f"shared memory region '{name}' already in manager", Status.ALREADY_EXISTS)

    def _add(self, region: Region) -> None:
        """Keep a region that opened. The name is checked last, as Triton checks the other arguments first
        (an empty name with a bad key gets Triton's error about the key); where Triton's gRPC front-end
        then registers a region named '', which no request or unregister can name alone, we refuse it with
        the words of Triton's HTTP front-end."""
        if not region.name:
            region.close()
            raise ServerError(f"'region name' is necessary to register {_KIND_TEXT[region.kind].lower()} shared "
                              "memory region")
        self._regions[region.name] = region

    def get(self, name: str) -> Region:
        """The region a request names."""
        region = self._regions.get(name)
        if region is None:
            raise not_found(f"Unable to find shared memory region: '{name}'")
        return region

    def status(self, kind: str, name: str = "") -> list[dict[str, Any]]:
        """Every region of ``kind`` (by name), or the one named."""
        if not name:
            return [self._regions[n].status() for n in sorted(self._regions) if self._regions[n].kind == kind]
        region = self._regions.get(name)
        if region is None:
            raise not_found(f"Unable to find {kind} shared memory region: '{name}'")
        if region.kind != kind:
            raise not_found(f"The region named '{name}' is registered as {_KIND_TEXT[region.kind]} shared memory, "
                            f"not {_KIND_TEXT[kind]} shared memory")
        return [region.status()]

    async def unregister(self, kind: str, name: str = "") -> None:
        """Unregister and unmap the named region of ``kind`` (none: every one); an unknown name is no error,
        as in Triton. A region that a request in flight uses stays registered, and the call fails with
        Triton 2.51's INTERNAL error once the others are gone: the side that loses the race gets the error
        (a request arriving after the unregister does not find the region)."""
        self._check_allowed()
        names = sorted(n for n, r in self._regions.items() if r.kind == kind and (not name or n == name))
        busy = [n for n in names if self._regions[n].users]
        for free in names:
            if free not in busy:
                self._regions.pop(free).close()
        if busy and name:
            raise internal(f"Cannot unregister shared memory region '{name}', it is currently in use.")
        if busy:
            raise internal(f"Failed to unregister the following {kind} shared memory regions: "
                           + "".join(f"{n} ," for n in busy))

    def close(self) -> None:
        """Unmap every region (at shutdown, once no request runs)."""
        regions = list(self._regions.values())
        self._regions.clear()
        for region in regions:
            region.close()
