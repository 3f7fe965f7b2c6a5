"""Adds ``triton-serve analyze`` through the core's command hook."""
from __future__ import annotations

from triton_serve.plugin import CommandRegistry, hookimpl


def _analyze(argv: list[str]) -> int:
    from .cli import main  # matplotlib and the rest load only when the command runs

    return main(argv)


@hookimpl
def tserve_register_commands(registry: CommandRegistry) -> None:
    registry.add("analyze", _analyze, "find the best max_batch_size, instance count and dynamic batching "
                                      "for a model with perf_analyzer")
