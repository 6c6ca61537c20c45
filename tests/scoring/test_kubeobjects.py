"""Reading Nodes and Pods into the model; nodes made by the cluster harness read back as what the pool spec said."""
from __future__ import annotations

import pytest

from gpuaas.cluster.pools import node_objects, parse_pool_spec
from gpuaas.workloads import gpu_pod, pod_for_demand
from scoring.model import PodDemand
from scoring.kubeobjects import (ObjectError, assigned_devices, node_spec, parse_quantity, pod_demand,
                                 pod_requests, requests_gpu)


@pytest.mark.parametrize("text,value", [("500m", "0.5"), ("2", "2"), ("1Gi", str(2**30)), ("1.5k", "1500"),
                                        ("100Mi", str(100 * 2**20)), (4, "4")])
def test_quantities(text, value):
    assert parse_quantity(text) == parse_quantity(value)


def pool_node(**gpu):
    return node_objects(parse_pool_spec({"pools": [{"name": "p", "count": 1, "cpu": "96", "memory": "1Ti",
                                                     "gpu": gpu}]}).pools[0])[0]


def test_whole_gpu_node_round_trip():
    spec = node_spec(pool_node(model="H100-80GB", count=8, topology={"nvlinkDomain": 8, "numaNode": 4}))
    assert (spec.name, spec.gpus, spec.gpu_model, spec.node_group) == ("p-0000", 8, "H100-80GB", "p")
    assert spec.cpu_milli == 96_000 and spec.memory_mib == 2**20
    assert spec.gpu_blocks == (0, 0, 0, 0, 1, 1, 1, 1)  # one NVSwitch domain, two NUMA halves
    assert spec.mig_layouts is None


def test_mixed_strategy_mig_node_round_trip():
    # 6 of 8 GPUs in all-balanced (2 x 1g.10gb, 1 x 2g.20gb, 1 x 3g.40gb each); 2 whole GPUs.
    spec = node_spec(pool_node(model="A100-80GB", count=8, mig="all-balanced", migGPUs=6))
    assert spec.gpus == 8
    assert spec.mig_layouts[:2] == (None, None)
    assert all(layout == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1} for layout in spec.mig_layouts[2:])


def test_unknown_product_is_named():
    node = pool_node(model="A100-80GB", count=8)
    node["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-Z9000"
    with pytest.raises(KeyError, match="NVIDIA-Z9000"):
        node_spec(node)


def test_whole_gpu_pod():
    demand = pod_demand(gpu_pod("train", "ml", gpus=4, cpu="8", memory="32Gi"))
    assert (demand.gpus, demand.gpu_milli, demand.cpu_milli, demand.memory_mib) == (4, 1000, 8000, 32768)
    assert demand.name == "ml/train"


def test_mig_pod_and_model_constraint():
    pod = gpu_pod("infer", mig="3g.40gb")
    pod["metadata"]["annotations"] = {"gpuaas.io/gpu-models": "NVIDIA-A100-SXM4-80GB, H100-80GB"}
    demand = pod_demand(pod)
    assert demand.mig_profile == "3g.40gb" and demand.gpus == 1
    assert demand.allowed_models == {"A100-80GB", "H100-80GB"}


def test_shared_gpu_pod():
    pod = gpu_pod("notebook")
    pod["spec"]["containers"][0]["resources"]["limits"]["gpuaas.io/gpu-share"] = "250"
    demand = pod_demand(pod)
    assert (demand.gpus, demand.gpu_milli, demand.is_share) == (1, 250, True)
    assert requests_gpu(pod)


def test_init_containers_count_as_the_scheduler_counts_them():
    pod = gpu_pod("p", cpu="1")
    pod["spec"]["initContainers"] = [
        {"name": "warmup", "resources": {"requests": {"cpu": "3"}}},                  # runs alone: max(3, 1+0)
        {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}},  # sidecar: adds
    ]
    # max(app 1 + sidecar 0.5, warmup 3 + the sidecars started before it, 0) = 3
    assert pod_requests(pod)["cpu"] == parse_quantity("3")
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "4"
    assert pod_requests(pod)["cpu"] == parse_quantity("4.5")  # max(4 + 0.5, 3)


@pytest.mark.parametrize("mutate,message", [
    (lambda p: p["spec"]["containers"][0]["resources"]["limits"].update({"nvidia.com/mig-1g.10gb": "1"}),
     "more than one kind of GPU"),
    (lambda p: p["spec"]["containers"][0]["resources"]["requests"].update({"nvidia.com/gpu": "two"}),
     "'two' is not a Kubernetes quantity"),
    (lambda p: p["metadata"].update(annotations={"gpuaas.io/gpu-models": "Z9000"}), "gpuaas.io/gpu-models"),
])
def test_bad_pods_are_refused_naming_the_field(mutate, message):
    pod = gpu_pod("bad", "ns", gpus=1)
    mutate(pod)
    with pytest.raises((ObjectError, KeyError), match=message):
        pod_demand(pod)


def test_device_annotation():
    pod = gpu_pod("p", gpus=2)
    assert assigned_devices(pod) is None
    pod["metadata"]["annotations"]["gpuaas.io/devices"] = "4,5"
    assert assigned_devices(pod) == (4, 5)
    pod["metadata"]["annotations"]["gpuaas.io/devices"] = "four"
    with pytest.raises(ObjectError, match="gpuaas.io/devices"):
        assigned_devices(pod)


@pytest.mark.parametrize("demand", [
    PodDemand(cpu_milli=6000, memory_mib=12288, gpus=2, gpu_milli=1000, name="ml/a"),
    PodDemand(cpu_milli=500, memory_mib=1024, gpus=1, gpu_milli=460, allowed_models=frozenset({"T4", "A10"}),
              name="ml/b"),
    PodDemand(cpu_milli=1000, memory_mib=2048, gpus=1, gpu_milli=1000, mig_profile="2g.20gb", name="ml/c"),
    PodDemand(cpu_milli=16000, memory_mib=65536, name="ml/d"),
])
def test_pod_for_demand_reads_back_as_the_same_demand(demand):
    assert pod_demand(pod_for_demand(demand.name.split("/")[1], "ml", demand)) == demand


def test_node_selector_and_affinity_on_the_product_label_narrow_the_models():
    pod = gpu_pod("p", gpus=1)
    pod["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod_demand(pod).allowed_models == {"H100-80GB"}
    pod["metadata"]["annotations"] = {"gpuaas.io/gpu-models": "A100-80GB,H100-80GB"}
    assert pod_demand(pod).allowed_models == {"H100-80GB"}  # both constraints hold: their intersection
    del pod["spec"]["nodeSelector"]
    pod["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                                     "values": ["NVIDIA-A100-SXM4-80GB"]}]}]}}}
    assert pod_demand(pod).allowed_models == {"A100-80GB"}
    # A second term without a product constraint allows any model: the affinity no longer narrows.
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"].append({"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]})
    assert pod_demand(pod).allowed_models == {"A100-80GB", "H100-80GB"}


def test_time_sliced_node_counts_physical_gpus():
    node = pool_node(model="A100-80GB", count=4)
    node["metadata"]["labels"]["nvidia.com/gpu.replicas"] = "4"
    for key in ("capacity", "allocatable"):
        node["status"][key]["nvidia.com/gpu"] = "16"  # the device plugin advertises replicas
    assert node_spec(node).gpus == 4


def test_a_node_whose_device_plugin_has_not_registered_offers_no_gpus():
    node = pool_node(model="H100-80GB", count=8)
    for key in ("capacity", "allocatable"):
        node["status"][key]["nvidia.com/gpu"] = "0"
    assert node_spec(node).gpus == 0
