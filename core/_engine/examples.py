"""The example repository served when no ``--model-repository`` is given, and which of its models this install
can serve."""
from __future__ import annotations

import logging
from pathlib import Path

from .config import read_config
from .errors import ServerError
from .pluginhost import PluginHost
from .registry import install_hint

EXAMPLE_REPOSITORY = Path(__file__).resolve().parents[1] / "example_repository"

log = logging.getLogger("triton_serve")


def servable_examples(plugins: PluginHost, names: list[str], config_name: str = "") -> list[str]:
    """The example models that the installed plugins can serve, an ensemble only with every model it calls. Each
    one left out is logged once with the plugin to install, so a minimal install serves the rest and gets ready."""
    reasons: dict[str, str] = {}
    calls: dict[str, list[str]] = {}
    for name in names:
        try:
            config = read_config(EXAMPLE_REPOSITORY / name, name, config_name)
        except ServerError as error:
            reasons[name] = error.message
            continue
        if config.platform == "ensemble" or config.HasField("ensemble_scheduling"):
            kind: str | None = "ensemble_scheduling"
            calls[name] = [step.model_name for step in config.ensemble_scheduling.step]
        else:
            try:
                plugins.backends.backend_name_for(config.backend, config.platform)
            except ServerError as error:
                reasons[name] = error.message
                continue
            kind = config.WhichOneof("scheduling_choice")
        if kind is not None and plugins.schedulers.get(kind) is None:
            reasons[name] = f"no installed plugin provides the '{kind}' scheduler; {install_hint(kind)}"
    changed = True
    while changed:  # an ensemble may call an ensemble
        changed = False
        for name, steps in calls.items():
            left_out = [step for step in steps if step in reasons]
            if left_out and name not in reasons:
                reasons[name] = f"it calls '{left_out[0]}', which is left out"
                changed = True
    for name in names:
        if name in reasons:
            log.info("example model '%s' is left out: %s", name, reasons[name])
    return [name for name in names if name not in reasons]
