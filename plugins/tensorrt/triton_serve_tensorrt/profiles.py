"""Optimization profiles: which ones an instance may use, how large a batch they take, and which
one runs a given batch (Triton's choice: the fitting profile closest to its optimum shapes)."""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from triton_serve.plugin import ModelConfig, ModelInstanceGroup, ServerError

from .engine_description import EngineDescription, Shape


def profile_indices(group: ModelInstanceGroup, num_profiles: int, model: str) -> list[int]:
    """The profiles an instance group may use, ascending: its ``profile`` list, or profile 0 when the
    list is empty (as in Triton). A name that is not a profile index of the engine is an error."""
    if not group.profile:
        return [0]
    indices: set[int] = set()
    for text in group.profile:
        index = int(text) if text.strip().isdigit() else -1
        if not 0 <= index < num_profiles:
            raise ServerError(f"model '{model}': instance_group '{group.name}' names profile '{text}', but the "
                              f"engine has {num_profiles} optimization profile(s), numbered 0 to {num_profiles - 1}")
        indices.add(index)
    return sorted(indices)


def model_profile_indices(config: ModelConfig, num_profiles: int, model: str) -> list[int]:
    """Every profile some instance group of the model may use, ascending."""
    groups: Iterable[ModelInstanceGroup] = config.instance_group or [ModelInstanceGroup()]
    return sorted({index for group in groups for index in profile_indices(group, num_profiles, model)})


def profile_max_batch_size(engine: EngineDescription, profile: int) -> int:
    """The largest batch one profile takes: the smallest maximum of dimension 0 over the inputs."""
    limits = [tensor.profiles[profile].max[0] for tensor in engine.inputs
              if not tensor.is_shape_tensor and tensor.profiles and tensor.profiles[profile].max]
    return min(limits) if limits else 0


def max_batch_size(engine: EngineDescription, profiles: Sequence[int]) -> int:
    """The largest batch any of ``profiles`` takes, or 0 when the engine cannot batch at all."""
    if not engine.supports_batching() or not profiles:
        return 0
    return max(profile_max_batch_size(engine, profile) for profile in profiles)


def select_profile(model: str, engine: EngineDescription, candidates: Sequence[int],
                   input_shapes: Mapping[str, Shape]) -> int:
    """The profile to run a batch with: of the ``candidates`` whose [min, max] range holds every input
    shape, the one with the smallest total distance from its optimum shapes; on a tie, the first
    candidate (Triton tries profiles in ascending order)."""
    inputs = [tensor for tensor in engine.inputs if not tensor.is_shape_tensor]
    missing = [tensor.name for tensor in inputs if tensor.name not in input_shapes]
    if missing:
        raise ServerError(f"model '{model}': the batch has no value for engine input(s) {missing}")
    best: int | None = None
    best_distance = 0
    for profile in candidates:
        ranges = [tensor.profiles[profile] for tensor in inputs]
        shapes = [tuple(input_shapes[tensor.name]) for tensor in inputs]
        if not all(shape_range.accepts(shape) for shape_range, shape in zip(ranges, shapes)):
            continue
        distance = sum(shape_range.distance(shape) for shape_range, shape in zip(ranges, shapes))
        if best is None or distance < best_distance:
            best, best_distance = profile, distance
    if best is None:
        raise ServerError(_no_profile_message(model, engine, candidates, input_shapes))
    return best


def _no_profile_message(model: str, engine: EngineDescription, candidates: Sequence[int],
                        input_shapes: Mapping[str, Shape]) -> str:
    inputs = [tensor for tensor in engine.inputs if not tensor.is_shape_tensor]
    given = ", ".join(f"'{t.name}' {list(input_shapes[t.name])}" for t in inputs)
    accepted = "; ".join(
        f"profile {profile} takes " + ", ".join(
            f"'{t.name}' from {list(t.profiles[profile].min)} to {list(t.profiles[profile].max)}" for t in inputs)
        for profile in candidates)
    return (f"model '{model}': no optimization profile among {list(candidates)} accepts the input shapes "
            f"{given}; {accepted}")
