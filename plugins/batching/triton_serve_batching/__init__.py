"""Triton's dynamic batcher and sequence batcher as a triton-serve scheduler plugin."""
