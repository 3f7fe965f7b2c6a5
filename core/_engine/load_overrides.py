"""Model-load overrides: the ``config`` and ``file:<path>`` load parameters, checked, and the private
model directory the files are written to."""
from __future__ import annotations

import base64
import binascii
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from google.protobuf import json_format, text_format

from .config import CONFIG_FILENAME
from .errors import ServerError
from .protos.model_config_pb2 import ModelConfig
from .sources import is_version_name

FILE_PREFIX = "file:"
CONFIG_PARAMETER = "config"


@dataclass
class LoadOverride:
    """What a load request replaces: the model's config, and (with ``files``) its whole directory."""

    config: ModelConfig
    files: dict[PurePosixPath, bytes] = field(default_factory=dict)

    def versions(self) -> list[int]:
        """The version folders the files make, ascending."""
        return sorted({int(path.parts[0]) for path in self.files
                       if len(path.parts) > 1 and is_version_name(path.parts[0])})

    def write_model_dir(self) -> Path:
        """A new private directory holding ``files`` and the override config as config.pbtxt; the
        caller removes it (``remove_model_dir``) when the model that loads from it goes away."""
        root = Path(tempfile.mkdtemp(prefix="triton-serve-override-"))
        try:
            for relative, content in self.files.items():
                path = root.joinpath(*relative.parts)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content)
            (root / CONFIG_FILENAME).write_text(text_format.MessageToString(self.config), encoding="utf-8")
        except BaseException:
            remove_model_dir(root)
            raise
        return root


def remove_model_dir(path: Path) -> None:
    """Delete a private model directory made by ``LoadOverride.write_model_dir``."""
    shutil.rmtree(path, ignore_errors=True)


def parse_load_parameters(name: str, parameters: Mapping[str, Any]) -> LoadOverride | None:
    """The override a load request's parameters ask for (None: load the model as the repository has
    it). ``config`` is a JSON ModelConfig string, each ``file:<version>/<name>`` value the file's bytes.
    Raises ServerError (INVALID_ARG) naming the parameter that is wrong."""
    config: ModelConfig | None = None
    files: dict[PurePosixPath, bytes] = {}
    for key, value in parameters.items():
        if key == CONFIG_PARAMETER:
            if not isinstance(value, str):
                raise ServerError(f"invalid value type for load parameter '{key}', expected string_param.")
            config = _parse_config(name, value)
        elif key.startswith(FILE_PREFIX):
            if not isinstance(value, bytes):
                raise ServerError(f"invalid value type for load parameter '{key}', expected bytes_param.")
            files[_file_path(key)] = value
        else:
            raise ServerError(f"unrecognized load parameter '{key}'.")
    for path in files:
        clash = next((parent for parent in path.parents if parent in files), None)
        if clash is not None:
            raise ServerError(f"Invalid file parameter '{FILE_PREFIX}{path}': its folder '{FILE_PREFIX}{clash}' "
                              "is a file")
    if files and config is None:
        raise ServerError(f"failed to load '{name}', failed to poll from model repository: Load parameter "
                          "'config' must be specified for model file override")
    return None if config is None else LoadOverride(config, files)


def decode_file_parameters(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """HTTP's load parameters with each ``file:`` value decoded from base64 to bytes (JSON has no bytes)."""
    decoded: dict[str, Any] = {}
    for key, value in parameters.items():
        if not isinstance(value, str):
            raise ServerError(f"Unable to parse load parameter '{key}': expected a JSON string")
        if key.startswith(FILE_PREFIX):
            try:
                decoded[key] = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError) as error:
                raise ServerError(f"Unable to parse load parameter '{key}': its value is not valid base64 "
                                  f"({error})") from None
        else:
            decoded[key] = value
    return decoded


def _parse_config(name: str, text: str) -> ModelConfig:
    try:
        return json_format.Parse(text, ModelConfig())
    except json_format.ParseError as error:
        raise ServerError(f"failed to load '{name}', failed to poll from model repository: "
                          f"Invalid config override: {error}") from None


def _file_path(key: str) -> PurePosixPath:
    """The relative path a ``file:`` parameter names; it must stay inside the model directory, and a
    file below the top level must be inside a version folder."""
    text = key[len(FILE_PREFIX):]
    path = PurePosixPath(text)
    parts = text.split("/")
    if not text or path.is_absolute() or any(part in ("", ".", "..") for part in parts) or "\0" in text:
        raise ServerError(f"Invalid file parameter '{key}': the path must be relative and stay within the "
                          "model directory (no '..', '.', empty or absolute parts)")
    if len(parts) > 1 and not is_version_name(parts[0]):
        raise ServerError(f"Invalid file parameter '{key}': '{parts[0]}' is not a model version folder "
                          "(a number without leading zeros)")
    return path
