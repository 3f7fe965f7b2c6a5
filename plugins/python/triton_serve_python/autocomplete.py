"""Runs a model's ``auto_complete_config`` in a throw-away process (as Triton does) and applies the result."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import json_format

from triton_serve.plugin import ModelConfig, ModelSpec, ServerError, config_to_json


def auto_complete(model: ModelSpec, timeout_s: float) -> None:
    """Let ``TritonPythonModel.auto_complete_config`` fill in ``model.config``, if the class defines it."""
    model_file = model.model_file
    if not model_file.is_file() or "auto_complete_config" not in model_file.read_text(errors="replace"):
        return  # a model without the method keeps its config; a missing file fails at load, clearly
    config = config_to_json(model.config)
    config["name"] = config.get("name") or model.name
    where = f"auto_complete_config of python model '{model.name}'"
    with tempfile.TemporaryDirectory(prefix="tserve_python_autocomplete_") as folder:
        result_file = Path(folder) / "result.json"
        try:
            finished = subprocess.run(
                [sys.executable, "-m", "triton_serve_python.autocomplete_process", str(model_file), str(result_file)],
                input=json.dumps(config), capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise ServerError(f"{where} did not finish within {timeout_s:g} s (stub-timeout-seconds)") from None
        if not result_file.is_file():
            if finished.returncode == 0:
                return  # the class does not define auto_complete_config
            tail = finished.stderr.strip().splitlines()[-1:] or ["no output"]
            raise ServerError(f"{where} ended its process with code {finished.returncode}: {tail[0]}")
        result = json.loads(result_file.read_text())
    if "error" in result:
        raise ServerError(f"{where} failed: {result['error']}")
    try:
        completed = json_format.ParseDict(result["config"], ModelConfig())
    except json_format.ParseError as error:
        raise ServerError(f"{where} produced an invalid model config: {error}") from None
    model.config.CopyFrom(completed)
