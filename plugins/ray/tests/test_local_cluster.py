"""LocalCluster, the several-node Ray cluster the Ray tests run on: a node that fails to start is named in the
error with the end of its output and of the head's GCS log, and the cluster is stopped."""
from __future__ import annotations

import pytest

from triton_serve_ray.local_cluster import ClusterFailed, LocalCluster, NodeSpec


def test_a_node_that_fails_to_start_is_named_with_its_output_and_the_heads_gcs_log() -> None:
    nodes = LocalCluster([NodeSpec(1), NodeSpec(-1, ip="127.0.0.2")], start_timeout_s=180)  # Ray refuses -1 CPUs
    with pytest.raises(ClusterFailed) as failed:
        nodes.start()
    message = str(failed.value)
    assert message.startswith("the Ray node 1 (127.0.0.2) exited with status 1 before it started")
    assert "Resource quantities must be nonnegative" in message  # the node's own output
    assert "the end of the head's GCS log (gcs_server.out):\n" in message and "(gcs_server)" in message
    assert nodes.processes == [] and not nodes.temp_dir.exists()  # stopped, its directory gone
