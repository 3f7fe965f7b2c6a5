"""The search space: candidate configurations, and how one changes a model's configuration."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format

from triton_serve.plugin import ModelConfig


@dataclass(frozen=True, order=True)
class Candidate:
    """One configuration to measure: the fields analyze changes in the model's config."""

    max_batch_size: int
    instance_count: int
    dynamic_batching: bool
    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()

    @property
    def key(self) -> str:
        """A short stable name: ``mbs=8 count=2 dyn=100us`` (also the checkpoint's key)."""
        batching = f"dyn={self.max_queue_delay_us}us" if self.dynamic_batching else "no-dyn"
        if self.preferred_batch_sizes:
            batching += " pref=" + ",".join(map(str, self.preferred_batch_sizes))
        return f"mbs={self.max_batch_size} count={self.instance_count} {batching}"

    def as_dict(self) -> dict[str, Any]:
        return {"max_batch_size": self.max_batch_size, "instance_count": self.instance_count,
                "dynamic_batching": self.dynamic_batching, "max_queue_delay_us": self.max_queue_delay_us,
                "preferred_batch_sizes": list(self.preferred_batch_sizes)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Candidate:
        return cls(int(data["max_batch_size"]), int(data["instance_count"]), bool(data["dynamic_batching"]),
                   int(data["max_queue_delay_us"]), tuple(int(n) for n in data["preferred_batch_sizes"]))


@dataclass(frozen=True)
class Batching:
    """One point of the batching axis: off, or on with a queue delay (and preferred sizes = [max])."""

    enabled: bool
    delay_us: int = 0
    prefer_max: bool = False


@dataclass
class SearchSpace:
    """The axes: max_batch_size values, instance counts, batching variants (each axis in search order)."""

    max_batch_sizes: list[int]
    instance_counts: list[int]
    batching: list[Batching] = field(default_factory=list)

    @classmethod
    def build(cls, base: dict[str, Any], max_batch_sizes: list[int], instance_counts: list[int],
              dynamic_batching: str, delays_us: list[int], preferred: bool) -> SearchSpace:
        """The space for a model whose served config is ``base``: a model that cannot batch
        (``max_batch_size: 0``) only varies its instance count."""
        if int(base.get("max_batch_size", 0)) == 0:
            return cls([0], instance_counts, [Batching(False)])
        variants = [Batching(False)] if dynamic_batching in ("off", "both") else []
        if dynamic_batching in ("on", "both"):
            for delay in delays_us:
                variants.append(Batching(True, delay))
                if preferred:
                    variants.append(Batching(True, delay, prefer_max=True))
        return cls(sorted(set(max_batch_sizes)), sorted(set(instance_counts)), variants)

    def candidate(self, mbs_index: int, count_index: int, batching_index: int) -> Candidate:
        mbs, variant = self.max_batch_sizes[mbs_index], self.batching[batching_index]
        return Candidate(mbs, self.instance_counts[count_index], variant.enabled, variant.delay_us,
                         (mbs,) if variant.prefer_max else ())

    @property
    def shape(self) -> tuple[int, int, int]:
        return len(self.max_batch_sizes), len(self.instance_counts), len(self.batching)

    @property
    def size(self) -> int:
        a, b, c = self.shape
        return a * b * c


@dataclass(frozen=True)
class Dependent:
    """An ensemble in the repository whose steps call the tuned model: Triton loads it only while each model it
    calls has a max_batch_size of at least its own."""

    name: str
    max_batch_size: int


def ensembles_calling(repository: Path, model: str) -> list[Dependent]:
    """The ensembles in ``repository`` (their ``config.pbtxt``) with a step that calls ``model``; a config that
    does not parse is left to the server to report."""
    found = []
    for path in sorted(repository.glob("*/config.pbtxt")):
        try:
            config = parse_pbtxt(path.read_text())
        except (OSError, UnicodeDecodeError, text_format.ParseError):
            continue
        if any(step.model_name == model for step in config.ensemble_scheduling.step):
            found.append(Dependent(config.name or path.parent.name, config.max_batch_size))
    return found


def keep_what_dependents_allow(space: SearchSpace, model: str, dependents: list[Dependent]) -> str:
    """Drop the max_batch_size values that would make a dependent ensemble fail to load (adding the smallest one
    that works where none is left); returns what was done, for the output ("" when nothing changed)."""
    floor = max((d.max_batch_size for d in dependents), default=0)
    if floor == 0 or space.max_batch_sizes == [0]:
        return ""
    kept = [size for size in space.max_batch_sizes if size >= floor] or [floor]
    if kept == space.max_batch_sizes:
        return ""
    space.max_batch_sizes = kept
    callers = ", ".join(f"'{d.name}' (max_batch_size {d.max_batch_size})" for d in dependents if d.max_batch_size)
    return (f"model '{model}' is called by ensemble {callers}: max_batch_size candidates kept to "
            f"{', '.join(map(str, kept))} so that it keeps loading")


def check_model_config(name: str, config: dict[str, Any]) -> None:
    """Refuse the models analyze cannot tune, with the reason."""
    if config.get("platform") == "ensemble" or config.get("ensemble_scheduling"):
        raise ValueError(f"model '{name}' is an ensemble: it has no instances or batcher of its own; "
                         "analyze the models its steps call")
    if config.get("sequence_batching"):
        raise ValueError(f"model '{name}' uses the sequence batcher; analyze tunes dynamic batching only")


def apply_to_json(base: dict[str, Any], candidate: Candidate) -> dict[str, Any]:
    """The served config (Triton's JSON form) changed to ``candidate``: what the load override sends."""
    config = copy.deepcopy(base)
    config["max_batch_size"] = candidate.max_batch_size
    groups = config.get("instance_group") or [{"kind": "KIND_CPU"}]
    config["instance_group"] = [{**groups[0], "count": candidate.instance_count}] + groups[1:]
    if candidate.dynamic_batching:
        batching = dict(config.get("dynamic_batching") or {})
        batching["max_queue_delay_microseconds"] = candidate.max_queue_delay_us
        batching["preferred_batch_size"] = list(candidate.preferred_batch_sizes)
        config["dynamic_batching"] = batching
    else:
        config.pop("dynamic_batching", None)
    return config


def apply_to_proto(config: ModelConfig, candidate: Candidate, served: dict[str, Any]) -> ModelConfig:
    """A copy of the user's ``config`` with the candidate's fields; the rest of it is kept as written."""
    result = ModelConfig()
    result.CopyFrom(config)
    result.max_batch_size = candidate.max_batch_size
    if not result.instance_group:
        kind = (served.get("instance_group") or [{}])[0].get("kind", "KIND_CPU")
        json_format.ParseDict({"kind": kind}, result.instance_group.add())
    result.instance_group[0].count = candidate.instance_count
    if candidate.dynamic_batching:
        result.dynamic_batching.max_queue_delay_microseconds = candidate.max_queue_delay_us
        del result.dynamic_batching.preferred_batch_size[:]
        result.dynamic_batching.preferred_batch_size.extend(candidate.preferred_batch_sizes)
    else:
        result.ClearField("dynamic_batching")
    return result


def parse_pbtxt(text: str) -> ModelConfig:
    return text_format.Parse(text, ModelConfig())


def proto_from_json(config: dict[str, Any]) -> ModelConfig:
    return json_format.ParseDict(config, ModelConfig(), ignore_unknown_fields=True)


def to_pbtxt(config: ModelConfig) -> str:
    return text_format.MessageToString(config)
