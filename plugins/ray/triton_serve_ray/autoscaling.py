"""Autoscaling on the requests the replicas hold: they reach the replicas over the channel, so Ray's own
ongoing-request counters (kept by its proxy and handles) stay at zero."""
from __future__ import annotations

import copy
from typing import Any

from ray.serve.autoscaling_policy import replica_queue_length_autoscaling_policy
from ray.serve.config import AutoscalingContext

ONGOING_REQUESTS = "ongoing_requests"  # the metric each replica reports (ModelReplica.record_autoscaling_stats)
POLICY = f"{__name__}:ongoing_requests_policy"


def ongoing_requests_policy(ctx: AutoscalingContext) -> tuple[int | float, dict[str, Any]]:
    """Ray's default policy (``target_ongoing_requests``, upscale and downscale delays, bounds), fed the
    replicas' own counts of the requests they hold instead of Ray's."""
    reported = (ctx.aggregated_metrics or {}).get(ONGOING_REQUESTS, {})
    counted = copy.copy(ctx)
    counted._total_num_requests_value = float(sum(reported.values()))  # what ctx.total_num_requests reads
    return replica_queue_length_autoscaling_policy(counted)
