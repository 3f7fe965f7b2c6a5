"""The search space: candidate configurations, and how one changes a model's configuration."""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
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
