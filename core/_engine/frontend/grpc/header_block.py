"""HPACK header blocks (RFC 7541) on the server side of gRPC's HTTP/2: the literal fields the server writes, and
the decoding of a request's block, with its size bounded and its fields checked as RFC 9113 asks."""
from __future__ import annotations

import hpack

MAX_HEADER_LIST = 16_384  # SETTINGS_MAX_HEADER_LIST_SIZE (grpc core's hard metadata limit); larger gets 431
MAX_DECODED_HEADER_LIST = 4 * MAX_HEADER_LIST  # past this the block is not decoded further: the connection ends


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal_header(name: bytes, value: bytes) -> bytes:
    """One header as an HPACK literal without indexing, new name, no Huffman coding."""
    return b"\x00" + _hpack_int(len(name), 7, 0) + name + _hpack_int(len(value), 7, 0) + value


STATUS_200 = b"\x88"  # :status 200, index 8 of the static table


class HeaderListTooLarge(Exception):
    """A decoded header list larger than SETTINGS_MAX_HEADER_LIST_SIZE (the decoder's state stays valid)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"header list of {size} bytes")
        self.size = size


class HeaderDecoder:
    """hpack's decoder, remembering the headers of blocks made only of indexed fields. Such a block leaves the
    dynamic table as it is, so it means the same headers until a block that changes the table comes; a gRPC client
    sends the same block for every call on a connection once its headers are in the table, and hpack's pure-Python
    decoding of it is the largest cost of a small call."""

    KEPT = 64  # blocks remembered per connection

    def __init__(self) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=MAX_DECODED_HEADER_LIST)
        self._known: dict[bytes, tuple[list[tuple[str, str]], str | None]] = {}

    def decode(self, block: bytes) -> tuple[list[tuple[str, str]], str | None]:
        """The block's (name, value) pairs, and what makes them a malformed request (None if nothing does); the
        list is shared between calls with the same block: do not change it. Raises HeaderListTooLarge past
        MAX_HEADER_LIST (RFC 9113 §6.5.2's size: names, values and 32 per field), and hpack's errors
        (OversizedHeaderListError past MAX_DECODED_HEADER_LIST) when the block is not valid."""
        known = self._known.get(block)
        if known is not None:
            return known
        pairs = [(str(name), str(value)) for name, value in self._decoder.decode(block)]
        indexed = _only_indexed(block)
        if not indexed:
            self._known.clear()  # the table may have changed: an index may now mean another header
        size = sum(len(name) + len(value) + 32 for name, value in pairs)
        if size > MAX_HEADER_LIST:
            raise HeaderListTooLarge(size)
        decoded = pairs, _request_problem(pairs)
        if indexed and len(self._known) < self.KEPT:
            self._known[block] = decoded
        return decoded


_REQUEST_PSEUDO = frozenset((":method", ":scheme", ":path", ":authority"))
_CONNECTION_SPECIFIC = frozenset(("connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"))


def _request_problem(pairs: list[tuple[str, str]]) -> str | None:
    """What makes ``pairs`` a malformed request (RFC 9113 §8.2 and §8.3), or None."""
    seen: set[str] = set()
    method, regular = "", False
    for name, value in pairs:
        if name != name.lower():
            return f"upper-case field name '{name}'"
        if "\x00" in value or "\r" in value or "\n" in value or value[:1] in (" ", "\t") or value[-1:] in (" ", "\t"):
            return f"invalid value of field '{name}'"
        if name[:1] == ":":
            if regular or name not in _REQUEST_PSEUDO or name in seen:
                return f"pseudo-header field '{name}' misplaced, unknown or repeated"
            seen.add(name)
            if name == ":method":
                method = value
            elif name == ":path" and not value:
                return "empty :path"
        else:
            regular = True
            if name in _CONNECTION_SPECIFIC or (name == "te" and value != "trailers"):
                return f"connection-specific field '{name}'"
    if method != "CONNECT" and not {":method", ":scheme", ":path"} <= seen:
        return "a :method, :scheme or :path pseudo-header field missing"
    return None


def _only_indexed(block: bytes) -> bool:
    """Whether every field of a (well-formed) header block is an indexed field (RFC 7541 6.1)."""
    at, end = 0, len(block)
    while at < end:
        first = block[at]
        if not first & 0x80:
            return False
        at += 1
        if first & 0x7F == 0x7F:  # the index goes on in bytes whose high bit says another follows
            while block[at] & 0x80:
                at += 1
            at += 1
    return True
