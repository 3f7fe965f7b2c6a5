"""triton-serve: a Triton-compatible inference server built as a pluggy plugin host."""

__version__ = "0.1.0"
