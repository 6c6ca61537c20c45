"""Config errors name what is wrong; the KWOK provider renders nodes with the pools renderer and holds GPUs back."""
from __future__ import annotations

import json

import pytest

from gpuaas.cluster.migmanager import mig_resources
from nodescaler.config import load_nodescaler_config
from nodescaler.provider import (
    GPU_READY_AT_ANNOTATION,
    GPU_RESOURCES_ANNOTATION,
    KWOK_NODE_ANNOTATION,
    REGISTERING_LABEL,
    FakeProvider,
    NodeNotFound,
    ProviderError,
    kwok_node,
    render_node,
)
from runtime.config import ConfigError
from runtime.pools import node_objects

from .builders import A100X8, config


@pytest.mark.parametrize("group, message", [
    ({"template": A100X8, "max_size": 2, "cost_per_hour": 1}, "groups.0.name: Field required"),
    ({"name": "g", "template": A100X8, "min_size": 3, "max_size": 2, "cost_per_hour": 1}, "min_size 3 is more than"),
    ({"name": "g", "template": {**A100X8, "gpu": {"model": "V200", "count": 8}}, "max_size": 2, "cost_per_hour": 1},
     "template: gpu.model"),
    ({"name": "g", "template": {**A100X8, "count": 3}, "max_size": 2, "cost_per_hour": 1}, "template.count is not"),
    ({"name": "g", "template": A100X8, "max_size": 2, "cost_per_hour": 0}, "cost_per_hour"),
    ({"name": "g", "template": A100X8, "max_size": 2, "cost_per_hour": 1, "maxsize": 3}, "maxsize: unknown field"),
])
def test_bad_groups_are_refused_naming_the_field(tmp_path, group, message):
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"groups": [group]}))
    with pytest.raises(ConfigError, match="invalid configuration") as err:
        load_nodescaler_config(path, environ={})
    assert message in str(err.value)


def test_environment_overrides_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"groups": [{"name": "g", "template": A100X8, "max_size": 2, "cost_per_hour": 1}]}))
    cfg = load_nodescaler_config(path, environ={"GPUAAS_NODESCALER_SCALE_IN__UNNEEDED_S": "30"})
    assert cfg.scale_in.unneeded_s == 30


def test_leader_timings_must_be_ordered():
    with pytest.raises(ValueError, match="retry_period_s < renew_deadline_s"):
        config(leader_election={"lease_duration_s": 5, "renew_deadline_s": 5})


def test_new_node_is_the_pool_rendering_with_gpus_held_back_until_ready():
    cfg = config()
    group = cfg.group("a100x8")
    node = render_node(group, "a100x8-abc123", now=100.0)
    reference = node_objects(group.pool)[0]
    product = "nvidia.com/gpu.product"
    assert node["metadata"]["labels"][product] == reference["metadata"]["labels"][product]
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "0"
    assert json.loads(node["metadata"]["annotations"][GPU_RESOURCES_ANNOTATION]) == {"nvidia.com/gpu": "8"}
    assert float(node["metadata"]["annotations"][GPU_READY_AT_ANNOTATION]) == 100.0 + group.provisioning_delay_s
    assert node["metadata"]["labels"][REGISTERING_LABEL] == "true"
    assert node["spec"]["providerID"] == "kwok://a100x8-abc123"
    # kwok plays it: the KWOK bits kwok_node adds, on the group's provider-neutral template.
    assert node["metadata"]["annotations"][KWOK_NODE_ANNOTATION] == "fake"
    assert node["metadata"]["labels"]["type"] == "kwok"
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "a100x8-abc123"
    assert node["metadata"]["name"] == "a100x8-abc123"
    template = group.template_node()
    assert "providerID" not in template["spec"] and KWOK_NODE_ANNOTATION not in template["metadata"]["annotations"]


def test_kwok_node_adds_what_kwok_needs_and_keeps_the_rest():
    (node,) = node_objects(config().group("a100x8").pool)
    neutral = json.loads(json.dumps(node))
    assert kwok_node(node) is node
    assert node["spec"]["providerID"] == f"kwok://{node['metadata']['name']}"
    assert node["metadata"]["annotations"] == {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0",
                                               **neutral["metadata"]["annotations"]}
    assert node["metadata"]["labels"] == {"type": "kwok", **neutral["metadata"]["labels"]}
    assert node["status"] == neutral["status"]


def test_mig_manager_resources_come_from_the_pool_renderer():
    (node,) = node_objects(config().group("a100x8").pool)
    res, labels = mig_resources(node, "all-3g.40gb")
    assert res == {"nvidia.com/gpu": "0", "nvidia.com/mig-3g.40gb": "16"}
    assert labels == {"nvidia.com/mig-3g.40gb.count": "16"}
    with pytest.raises(ValueError, match="MIG config 'all-9g'"):
        mig_resources(node, "all-9g")


def test_fake_provider_records_and_fails_on_demand():
    p = FakeProvider(next_error=ProviderError("boom"))
    g = config().group("a100x8")
    with pytest.raises(ProviderError):
        p.grow(g, 1)
    assert p.grow(g, 2) == ["a100x8-fake0", "a100x8-fake1"] and p.grow_calls == [("a100x8", 2)]
    p.delete_node(g, "x")
    with pytest.raises(NodeNotFound):
        p.delete_node(g, "x")


def test_unknown_scale_out_policy_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"groups": [{"name": "g", "template": A100X8, "max_size": 2, "cost_per_hour": 1}],
                                "scale_out": {"policy": "best-fit"}}))
    with pytest.raises(ConfigError,
                       match=r"scale_out\.policy: policy 'best-fit' is not one of random, least-allocated"):
        load_nodescaler_config(path, environ={})


def test_the_mig_manager_keeps_a_nodes_time_slicing():
    """A time-sliced A100 node (2 replicas) repartitioned to all-3g.40gb and back to all-disabled: its whole GPUs are
    advertised as replicas again (issue 16)."""
    cfg = config([{"name": "ts", "template": {"gpu": {"model": "A100-80GB", "count": 8, "replicas": 2}},
                   "max_size": 2, "cost_per_hour": 1}])
    (node,) = node_objects(cfg.group("ts").pool)
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "16"
    assert mig_resources(node, "all-3g.40gb")[0] == {"nvidia.com/gpu": "0", "nvidia.com/mig-3g.40gb": "16"}
    assert mig_resources(node, "all-disabled")[0] == {"nvidia.com/gpu": "16"}
