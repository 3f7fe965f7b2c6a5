"""PyTriton's API served by triton-serve: a PyTriton script runs by changing ``pytriton`` to
``triton_serve_pytriton`` in its imports (``from triton_serve_pytriton.triton import Triton``)."""
from __future__ import annotations
