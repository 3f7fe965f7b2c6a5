"""Reading a model file with OpenVINO, and OpenVINO's errors turned into messages a user can act on."""
from __future__ import annotations

from pathlib import Path

import openvino as ov

from triton_serve.plugin import ModelSpec, ServerError, Status

from .parameters import OpenVinoParameters

# Files OpenVINO reads besides IR, for the hint given when model.xml is missing.
_OTHER_FORMATS = ("model.onnx", "model.pdmodel", "model.tflite", "model.saved_model", "model.pb")


def new_core(parameters: OpenVinoParameters, model_name: str) -> ov.Core:
    """An ov.Core for one model, with the custom-layer library of CPU_EXTENSION_PATH loaded if given."""
    core = ov.Core()
    if parameters.cpu_extension_path:
        try:
            core.add_extension(parameters.cpu_extension_path)
        except RuntimeError as error:
            raise ServerError(f"model '{model_name}': parameter CPU_EXTENSION_PATH: OpenVINO cannot load "
                              f"'{parameters.cpu_extension_path}': {openvino_message(error)}") from None
    return core


def read_model(core: ov.Core, model: ModelSpec) -> ov.Model:
    """The model file of ``model`` as an ov.Model; a missing or unreadable file raises ServerError naming it."""
    path = model.model_file
    where = f"model '{model.name}' version {model.version}"
    if not path.exists():
        raise ServerError(f"{where}: model file '{path.name}' not found in {model.version_dir}"
                          f"{_other_format_hint(model.version_dir)}", Status.NOT_FOUND)
    try:
        return core.read_model(str(path))
    except RuntimeError as error:
        files = f"'{path.name}' (weights '{path.with_suffix('.bin').name}')" if path.suffix == ".xml" \
            else f"'{path.name}'"
        raise ServerError(f"{where}: OpenVINO cannot read model file {files}: {openvino_message(error)}") from None


def openvino_message(error: BaseException) -> str:
    """OpenVINO's message without its source-location lines ("Exception from src/...", "Check '...' failed at")."""
    lines = [line.strip() for line in str(error).splitlines()]
    kept = [line for line in lines if line and not line.startswith("Exception from ")
            and not (line.startswith("Check '") and " failed at " in line)]
    return " ".join(kept) or str(error).strip()


def _other_format_hint(version_dir: Path) -> str:
    found = [name for name in _OTHER_FORMATS if (version_dir / name).exists()]
    if not found:
        return ""
    return f"; to serve '{found[0]}' instead, set default_model_filename: \"{found[0]}\" in the model's config"
