"""Pool specs: what becomes a node, and what is refused before any process starts."""
from __future__ import annotations

import json

import pytest

from runtime.pools import PoolSpecError, node_objects, parse_pool_spec, pools_from_node_specs
from scoring.kubeobjects import node_spec
from scoring.model import NodeSpec


def spec(**pool):
    base = {"name": "p", "count": 2, "gpu": {"model": "A100-80GB", "count": 8}}
    base.update(pool)
    return {"pools": [base]}


unknown_field = pytest.param(spec(gpus=8), "pools[0].gpus: unknown field", id="unknown-field")
unknown_nested_field = pytest.param(spec(gpu={"model": "H100-80GB", "count": 8, "nvlink": 4}),
                                    "pools[0].gpu.nvlink: unknown field", id="unknown-nested-field")
negative_count = pytest.param(spec(count=-1), "pools[0].count: Input should be greater than or equal to 0",
                              id="negative-count")
mig_too_many = pytest.param(spec(gpu={"model": "A100-80GB", "count": 8, "mig": {"3g.40gb": 3}}),
                            "pools[0].gpu.mig: 3 x 3g.40gb on A100-80GB", id="mig-layout-overflows-gpu")
mig_wrong_model = pytest.param(spec(gpu={"model": "A100-40GB", "count": 8, "mig": {"1g.20gb": 1}}),
                               "pools[0].gpu.mig: ", id="mig-profile-of-another-model")
mig_on_t4 = pytest.param(spec(gpu={"model": "T4", "count": 4, "mig": "all-1g.10gb"}), "pools[0].gpu.mig: ",
                         id="mig-on-gpu-without-mig")
unknown_model = pytest.param(spec(gpu={"model": "B999", "count": 8}), "pools[0].gpu.model: unknown GPU model 'B999'",
                             id="unknown-model")
bad_quantity = pytest.param(spec(memory="lots"), "pools[0].memory: 'lots' is not a positive Kubernetes quantity",
                            id="bad-quantity")
duplicate = pytest.param({"pools": [{"name": "p", "count": 1}, {"name": "p", "count": 1}]},
                         "pool name 'p' is used twice", id="duplicate-pool")


@pytest.mark.parametrize("data,message", [unknown_field, unknown_nested_field, negative_count, mig_too_many,
                                          mig_wrong_model, mig_on_t4, unknown_model, bad_quantity, duplicate])
def test_broken_spec_is_refused_naming_the_field(data, message):
    with pytest.raises(PoolSpecError) as err:
        parse_pool_spec(data)
    assert message in str(err.value)


def test_mig_errors_say_why():
    with pytest.raises(PoolSpecError, match=r"3g\.40gb"):
        parse_pool_spec(spec(gpu={"model": "A100-80GB", "count": 8, "mig": {"3g.40gb": 3}}))
    with pytest.raises(PoolSpecError, match="A100-40GB"):
        parse_pool_spec(spec(gpu={"model": "A100-40GB", "count": 8, "mig": {"1g.20gb": 1}}))


def test_whole_gpu_node_objects():
    pool = parse_pool_spec(spec(count=2, labels={"team": "ml"},
                                taints=[{"key": "gpu", "value": "true", "effect": "NoSchedule"}],
                                gpu={"model": "H100-80GB", "count": 8,
                                     "topology": {"nvlinkDomain": 8, "numaNode": 4}})).pools[0]
    nodes = node_objects(pool)
    assert [n["metadata"]["name"] for n in nodes] == ["p-0000", "p-0001"]
    node = nodes[0]
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.count"] == "8" and labels["team"] == "ml"
    assert labels["nvidia.com/mig.config"] == "all-disabled"
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert not any(k.startswith("nvidia.com/mig-") for k in node["status"]["allocatable"])
    assert node["spec"]["taints"] == [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]
    topo = json.loads(node["metadata"]["annotations"]["gpuaas.io/gpu-topology"])
    assert topo == {"nvlinkDomains": [list(range(8))], "numaNodes": [[0, 1, 2, 3], [4, 5, 6, 7]]}


def test_rendered_nodes_are_provider_neutral():
    # runtime/pools.py knows no node provider: no provider ID, no kwok annotation or label (nodescaler/provider.py
    # adds those, for the node scaler's KWOK nodes and the harness's pools alike).
    pool = parse_pool_spec(spec(count=1, gpu={"model": "A100-80GB", "count": 8, "mig": "all-1g.10gb"})).pools[0]
    (node,) = node_objects(pool)
    assert "providerID" not in node["spec"]
    assert not any("kwok" in key or "kwok" in value for key, value in node["metadata"]["labels"].items())
    assert not any("kwok" in key for key in node["metadata"]["annotations"])


def test_the_local_cluster_creates_the_pool_nodes_kwok_plays():
    from gpuaas.cluster.local import pool_nodes

    pools = parse_pool_spec(spec(count=2, labels={"team": "ml"},
                                 taints=[{"key": "gpu", "value": "true", "effect": "NoSchedule"}]))
    nodes = pool_nodes(pools)
    assert [n["metadata"]["name"] for n in nodes] == ["p-0000", "p-0001"]
    for node, neutral in zip(nodes, node_objects(pools.pools[0]), strict=True):
        name = node["metadata"]["name"]
        # What kwok needs (it plays nodes annotated `kwok.x-k8s.io/node: fake`), as these nodes always carried it ...
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
        assert node["metadata"]["annotations"]["node.alpha.kubernetes.io/ttl"] == "0"
        assert node["metadata"]["labels"]["type"] == "kwok"
        assert node["spec"] == {"providerID": f"kwok://{name}", "taints": neutral["spec"]["taints"]}
        # ... on top of the rendering, unchanged.
        assert node["metadata"]["labels"] == {"type": "kwok", **neutral["metadata"]["labels"]}
        assert node["status"] == neutral["status"]
        kwok_annotations = ("kwok.x-k8s.io/node", "node.alpha.kubernetes.io/ttl")
        assert {k: v for k, v in node["metadata"]["annotations"].items() if k not in kwok_annotations} == \
            neutral["metadata"]["annotations"]


def test_mixed_strategy_mig_node_objects():
    # all-balanced on an 80 GB A100 is 2 x 1g.10gb + 1 x 2g.20gb + 1 x 3g.40gb per GPU; 6 of 8 GPUs in MIG mode.
    pool = parse_pool_spec(spec(gpu={"model": "A100-80GB", "count": 8, "mig": "all-balanced", "migGPUs": 6})).pools[0]
    alloc = node_objects(pool)[0]["status"]["allocatable"]
    assert alloc["nvidia.com/gpu"] == "2"
    assert alloc["nvidia.com/mig-1g.10gb"] == "12"
    assert alloc["nvidia.com/mig-2g.20gb"] == "6"
    assert alloc["nvidia.com/mig-3g.40gb"] == "6"
    labels = node_objects(pool)[0]["metadata"]["labels"]
    assert labels["nvidia.com/mig-1g.10gb.count"] == "12" and labels["nvidia.com/mig.strategy"] == "mixed"


def test_custom_mig_layout_is_spelled_out_in_the_config_label():
    pool = parse_pool_spec(spec(gpu={"model": "H100-80GB", "count": 4, "mig": {"3g.40gb": 1, "1g.10gb": 4}})).pools[0]
    node = node_objects(pool)[0]
    assert node["metadata"]["labels"]["nvidia.com/mig.config"] == "custom-4x1g.10gb-1x3g.40gb"
    assert node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "16"


def test_cpu_only_pool():
    node = node_objects(parse_pool_spec({"pools": [{"name": "cpu", "count": 1, "cpu": 32}]}).pools[0])[0]
    assert node["status"]["allocatable"]["cpu"] == "32"
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]


def test_a_pool_with_autoscale_is_a_node_group():
    from nodescaler.config import NodeGroupConfig

    pool = parse_pool_spec(spec(count=1, cpu="96", autoscale={"maxSize": 3, "provisioningDelaySeconds": 5,
                                                              "costPerHour": 32.77})).pools[0]
    group = NodeGroupConfig.from_pool(pool)
    assert (group.name, group.min_size, group.max_size, group.provisioning_delay_s, group.cost_per_hour) == \
        ("p", 0, 3, 5.0, 32.77)
    # The group's new nodes are what the pool's nodes are.
    assert group.template_node()["status"] == node_objects(pool)[0]["status"]
    assert group.template_node()["metadata"]["labels"] == node_objects(pool)[0]["metadata"]["labels"]
    with pytest.raises(ValueError, match="not a node group"):
        NodeGroupConfig.from_pool(parse_pool_spec(spec()).pools[0])


@pytest.mark.parametrize("count,autoscale,message", [
    (5, {"maxSize": 4, "costPerHour": 1}, "count 5 is outside autoscale [minSize 0, maxSize 4]"),
    (1, {"minSize": 3, "maxSize": 2, "costPerHour": 1}, "minSize 3 is more than maxSize 2"),
    (1, {"maxSize": 2}, "pools[0].autoscale.costPerHour: Field required"),
])
def test_bad_autoscale_is_refused(count, autoscale, message):
    with pytest.raises(PoolSpecError) as err:
        parse_pool_spec(spec(count=count, autoscale=autoscale))
    assert message in str(err.value)


def test_a_time_sliced_pool_renders_what_gfd_and_the_device_plugin_publish():
    """replicas: 4 (issue 16): 4 nvidia.com/gpu devices per GPU without MIG, GFD's replicas, sharing-strategy and
    -SHARED product labels; the model reads back 2 GPUs of 4 replicas each."""
    (node,) = node_objects(parse_pool_spec(spec(count=1, gpu={"model": "T4", "count": 2, "replicas": 4})).pools[0])
    labels = node["metadata"]["labels"]
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert (labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.replicas"]) == ("2", "4")
    assert labels["nvidia.com/gpu.product"] == "Tesla-T4-SHARED"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    model = node_spec(node)
    assert (model.gpus, model.gpu_model, model.gpu_replicas) == (2, "T4", 4)


def test_time_slicing_beside_mig_counts_the_gpus_without_mig_only():
    (node,) = node_objects(parse_pool_spec(spec(count=1, gpu={"model": "A100-80GB", "count": 8, "replicas": 2,
                                                               "mig": "all-3g.40gb", "migGPUs": 6})).pools[0])
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"  # 2 GPUs without MIG x 2 replicas
    assert node["status"]["allocatable"]["nvidia.com/mig-3g.40gb"] == "12"


@pytest.mark.parametrize("gpu,extra,message", [
    ({"model": "T4", "count": 1, "replicas": 0}, {}, "pools[0].gpu.replicas: Input should be greater than or equal"),
    ({"model": "T4", "count": 1, "replicas": 1001}, {}, "pools[0].gpu.replicas: Input should be less than or equal"),
    ({"model": "T4", "count": 1, "replicas": 4}, {"dra": True}, "gpu.replicas 4 is the device plugin's time-slicing"),
])
def test_bad_replicas_are_refused_naming_the_field(gpu, extra, message):
    with pytest.raises(PoolSpecError) as err:
        parse_pool_spec(spec(gpu=gpu, **extra))
    assert message in str(err.value)


def test_a_trace_cluster_keeps_its_time_sliced_nodes_apart():
    specs = [NodeSpec("a", 8000, 32768, gpus=1, gpu_model="T4", gpu_replicas=4), NodeSpec("b", 8000, 32768, gpus=1,
                                                                                        gpu_model="T4")]
    pools = pools_from_node_specs(specs).pools
    assert [(p.gpu.replicas if p.gpu else None) for p in pools] == [4, 1]
