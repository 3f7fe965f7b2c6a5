"""The ``fil`` backend: Triton FIL model repositories served with Treelite (CPU) or XGBoost (GPU)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from triton_serve.plugin import AutoCompleteOptions, Backend, Model, ModelSpec

from .model_config import complete_config
from .options import DEFAULT_MODEL_TYPE, MODEL_FILES, FilParameters
from .outputs import OutputRule

if TYPE_CHECKING:
    from triton_serve.plugin import ModelConfig

    from .forest import Forest


class FilBackend(Backend):
    """Serves XGBoost (legacy binary, JSON, UBJSON), LightGBM text and Treelite checkpoint models.

    Options: ``default-max-batch-size``, the max_batch_size that auto-complete gives a config without one.
    Model parameters: ``FilParameters``.
    """

    name = "fil"
    default_model_filename = MODEL_FILES[DEFAULT_MODEL_TYPE]
    instance_kinds = ("CPU", "GPU")
    Options = AutoCompleteOptions
    Parameters = FilParameters
    options: AutoCompleteOptions

    def unavailable_reason(self) -> str | None:
        try:
            import treelite  # noqa: F401
        except ImportError as error:
            return f"Treelite cannot be imported ({error}): pip install treelite"
        return None

    def auto_complete_config(self, model: ModelSpec) -> None:
        config = model.config
        if config.input and config.output and config.max_batch_size > 0:
            return
        parameters: FilParameters = model.parameters
        forest = read_forest(parameters, model, config)
        complete_config(config, forest, output_rule(parameters, forest), self.options.default_max_batch_size)

    def create_model(self, spec: ModelSpec) -> Model:
        from .instance import FilModel

        return FilModel(self, spec)


def read_forest(options: FilParameters, model: ModelSpec, config: ModelConfig) -> Forest:
    """The model file of ``model`` read into Treelite (imported here, so a missing Treelite only
    makes the backend unavailable instead of breaking the plugin's import)."""
    from .forest import load_forest
    return load_forest(options.model_path(model.version_dir, config), options.model_type,
                       options.xgboost_allow_unknown_field)


def output_rule(options: FilParameters, forest: Forest) -> OutputRule:
    """The output semantics for a model; without output_class/is_classifier, the model's task decides."""
    is_classifier = forest.is_classifier_task if options.is_classifier is None else options.is_classifier
    return OutputRule(forest.num_scores, is_classifier, options.predict_proba, options.threshold)
