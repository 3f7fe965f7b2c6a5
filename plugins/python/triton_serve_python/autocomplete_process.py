"""The throw-away process that runs a model's ``auto_complete_config``."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from .pb_utils.model_config import ModelConfig
from .runner import load_model_class


def main(argv: list[str]) -> int:
    """``python -m triton_serve_python.autocomplete_process <model.py> <result.json>``: read the config JSON on
    stdin, write ``{"config": ...}`` or ``{"error": ...}`` (nothing if the class has no ``auto_complete_config``)."""
    model_file, result_file = argv[1], Path(argv[2])
    config = ModelConfig(sys.stdin.read())
    try:
        method = getattr(load_model_class(model_file), "auto_complete_config", None)
        if method is None:
            return 0
        completed = method(config)
        if not isinstance(completed, ModelConfig):
            raise TypeError(f"auto_complete_config must return the pb_utils.ModelConfig it was given, "
                            f"got {type(completed).__name__}")
        result: dict[str, Any] = {"config": completed.as_dict()}
    except Exception as error:
        result = {"error": f"{type(error).__name__}: {error}"}
    result_file.write_text(json.dumps(result))
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
