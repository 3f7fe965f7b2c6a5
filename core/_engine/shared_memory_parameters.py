"""The tensor parameters that name a shared-memory region (both protocols spell them alike), as codecs read them."""
from __future__ import annotations

import numpy as np

from .datatypes import BY_NAME

REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"


def no_data(datatype: str) -> np.ndarray:
    """The data of a tensor whose bytes are in a region: an empty array of its dtype."""
    return np.empty(0, BY_NAME[datatype].numpy)
