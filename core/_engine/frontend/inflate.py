"""Inflating compressed request bodies within one budget per front-end process.

A gzip body of a few KB can inflate to gigabytes, so the bytes that all requests of one front-end (HTTP or gRPC)
hold inflated together stay within one maximum request size. Each front-end maps the three refusals to its own
status and words.
"""

from __future__ import annotations

import zlib

# zlib's window bits per content coding: gzip's header and trailer, or zlib's (HTTP's and gRPC's "deflate").
WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class Undecodable(Exception):
    """The payload is not valid compressed data; the message is zlib's reason."""


class TooLarge(Exception):
    """The payload alone inflates past the limit; ``size`` is how many bytes it reached before it was stopped."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class BudgetSpent(Exception):
    """The payload would fit alone, but not beside what other requests hold inflated now."""


class InflateBudget:
    """The bytes that compressed requests hold inflated in one front-end process, kept within ``limit``."""

    __slots__ = ("limit", "held")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def inflate(self, payload: bytes, wbits: int) -> bytes:
        """``payload`` inflated, its bytes counted as held until ``give_back``; at most what the budget has left
        is allocated before a refusal."""
        room = self.limit - self.held
        inflater = zlib.decompressobj(wbits)
        try:
            data = inflater.decompress(payload, room + 1)
        except zlib.error as error:
            raise Undecodable(str(error)) from None
        if len(data) > room:
            if not self.held:
                raise TooLarge(len(data))
            raise BudgetSpent()
        if not inflater.eof:
            raise Undecodable("incomplete data")
        self.held += len(data)
        return data

    def give_back(self, size: int) -> None:
        """A request that held ``size`` bytes inflated is done with them."""
        self.held -= size
