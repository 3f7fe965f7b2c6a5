"""HTTP request headers as the endpoints read them."""
from __future__ import annotations

from collections.abc import Sequence


def header_dict(headers: Sequence[tuple[bytes, bytes]]) -> dict[str, str]:
    """Raw (name, value) headers (names lower case) as text; of a name sent twice, the first counts, as in Triton
    (reversed, it is the last one set)."""
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in reversed(headers)}
