"""triton-serve's ``tensorrt`` backend: serves TensorRT plan files (platform ``tensorrt_plan``)."""
from __future__ import annotations

__version__ = "0.1.0"
