"""The HTTP response head and body that uvicorn writes separately leave in one socket write."""
from __future__ import annotations

import asyncio
from typing import Any

from triton_serve._engine.frontend.http.infer_protocol import CoalescingTransport


class _RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 8000) if name == "sockname" else default


def test_writes_of_one_loop_turn_leave_together_and_close_flushes_first() -> None:
    async def scenario() -> _RecordingTransport:
        raw = _RecordingTransport()
        transport = CoalescingTransport(raw)  # type: ignore[arg-type]
        transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        transport.write(b"{}")
        assert raw.writes == []  # nothing leaves before the turn ends
        await asyncio.sleep(0)
        assert raw.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
        transport.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        transport.close()  # an error answer written then closed at once still goes out, before the close
        assert raw.writes[-1] == b"HTTP/1.1 400 Bad Request\r\n\r\n" and raw.closed
        assert transport.get_extra_info("sockname") == ("127.0.0.1", 8000)  # everything else is the transport's
        return raw

    raw = asyncio.run(scenario())
    assert len(raw.writes) == 2
