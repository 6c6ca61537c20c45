"""Node/Pod dicts -> model, and the gpuaas.io/devices annotation."""
import pytest

from scoring.kube import (
    DeviceAssignment, KubeObjectError, cluster_state, cpu_milli, format_devices, memory_mib, node_spec,
    parse_devices, pod_demand,
)


def node(name="g1", labels=None, alloc=None):
    return {"metadata": {"name": name, "labels": labels or {}},
            "status": {"allocatable": alloc or {"cpu": "96", "memory": "384Gi"}}}


def pod(name="p", containers=(), annotations=None, node_name=None, **spec):
    body = {"containers": [{"name": f"c{i}", "resources": r} for i, r in enumerate(containers)], **spec}
    if node_name:
        body["nodeName"] = node_name
    return {"metadata": {"name": name, "annotations": annotations or {}}, "spec": body, "status": {"phase": "Running"}}


@pytest.mark.parametrize("value, milli", [("2", 2000), ("500m", 500), ("0.25", 250), (3, 3000), ("1e1", 10000)])
def test_cpu_quantities(value, milli):
    assert cpu_milli(value) == milli


@pytest.mark.parametrize("value, mib", [("16Gi", 16384), ("1024Ki", 1), ("1M", 1), ("512Mi", 512), ("1Ti", 1048576)])
def test_memory_quantities(value, mib):
    # 1M = 10^6 bytes = 0.95 MiB -> rounded up to 1.
    assert memory_mib(value) == mib


def test_gpu_node_from_gfd_labels():
    spec = node_spec(node(labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "8",
                                  "nvidia.com/gpu.memory": "81920"},
                          alloc={"cpu": "128", "memory": "1Ti", "nvidia.com/gpu": "8"}))
    assert (spec.cpu_milli, spec.memory_mib, spec.gpus, spec.gpu_model) == (128_000, 1_048_576, 8, "A100-80GB")
    assert spec.mig_layouts is None


def test_time_sliced_node_counts_physical_gpus():
    # 4 GPUs x 4 replicas: the device plugin advertises nvidia.com/gpu = 16.
    spec = node_spec(node(labels={"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.replicas": "4"},
                          alloc={"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "16"}))
    assert spec.gpus == 4


def test_mig_config_label_applies_layout_to_every_gpu():
    spec = node_spec(node(labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "2",
                                  "nvidia.com/mig.config": "all-balanced"}))
    assert spec.mig_layouts == ({"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},) * 2


def test_mixed_strategy_resources_without_known_config():
    # 2 GPUs, 4 x 3g.40gb advertised -> 2 per GPU.
    spec = node_spec(node(labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "2",
                                  "nvidia.com/mig.config": "custom-1"},
                          alloc={"cpu": "64", "memory": "512Gi", "nvidia.com/mig-3g.40gb": "4"}))
    assert spec.mig_layouts == ({"3g.40gb": 2},) * 2


@pytest.mark.parametrize("labels, alloc, message", [
    ({"nvidia.com/gpu.product": "Z80", "nvidia.com/gpu.count": "1"}, None, "label nvidia.com/gpu.product='Z80'"),
    ({"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "x"}, None, "nvidia.com/gpu.count is not an"),
    ({}, {"cpu": "lots", "memory": "1Gi"}, "allocatable cpu: not a quantity: 'lots'"),
    ({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "2"},
     {"cpu": "1", "memory": "1Gi", "nvidia.com/mig-3g.40gb": "3"}, "cannot be split evenly over 2 GPUs"),
    ({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "1"},
     {"cpu": "1", "memory": "1Gi", "nvidia.com/mig-3g.40gb": "3"}, "do not fit one GPU: 3 x 3g.40gb"),
    ({"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "2", "gpuaas.io/gpu-blocks": "0"}, None,
     "names 1 GPUs, node has 2"),
])
def test_node_errors(labels, alloc, message):
    with pytest.raises(KubeObjectError) as info:
        node_spec(node("bad", labels, alloc))
    assert "node bad" in str(info.value) and message in str(info.value)


def test_pod_requests_sum_containers_and_respect_init():
    p = pod(containers=[{"requests": {"cpu": "1", "memory": "1Gi"}},
                        {"requests": {"cpu": "500m"}, "limits": {"nvidia.com/gpu": "2"}}],
            initContainers=[{"name": "init", "resources": {"requests": {"cpu": "4"}}}])
    d = pod_demand(p)
    # containers: 1000 + 500 = 1500m; init 4000m is larger -> 4000m. Memory 1Gi = 1024 MiB. 2 whole GPUs.
    assert (d.cpu_milli, d.memory_mib, d.gpus, d.gpu_milli) == (4000, 1024, 2, 1000)


def test_pod_share_mig_and_models():
    share = pod_demand(pod(containers=[{"limits": {"nvidia.com/gpu": 1}}], annotations={"gpuaas.io/gpu-milli": "300"},
                           nodeSelector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}))
    assert (share.gpus, share.gpu_milli, share.allowed_models) == (1, 300, frozenset({"A100-80GB"}))
    mig = pod_demand(pod(containers=[{"limits": {"nvidia.com/mig-3g.40gb": 1}}]))
    assert (mig.gpus, mig.mig_profile) == (1, "3g.40gb")
    aff = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                               "values": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"]}]}]}}}
    d = pod_demand(pod(containers=[{"limits": {"nvidia.com/gpu": 1}}], affinity=aff))
    assert d.allowed_models == frozenset({"H100-80GB", "H200-141GB"})


@pytest.mark.parametrize("p, message", [
    (pod("x", containers=[{"limits": {"nvidia.com/gpu": 2}}], annotations={"gpuaas.io/gpu-milli": "300"}),
     "pod x: annotation gpuaas.io/gpu-milli=300 needs 1..1000"),
    (pod("x", containers=[{"limits": {"nvidia.com/mig-1g.10gb": 2}}]), "pod x: one MIG instance per pod"),
    (pod("x", containers=[{"requests": {"cpu": "1z"}}]), "pod x: container c0 cpu: not a quantity"),
    (pod("x", containers=[{}], annotations={"gpuaas.io/gpu-models": "Z80"}), "pod x: allowed GPU model"),
])
def test_pod_errors(p, message):
    with pytest.raises(KubeObjectError) as info:
        pod_demand(p)
    assert message in str(info.value)


@pytest.mark.parametrize("text, devices", [
    ("0,1", [DeviceAssignment(0), DeviceAssignment(1)]),
    ("3:250", [DeviceAssignment(3, 250)]),
    ("5/3g.40gb@4", [DeviceAssignment(5, 0, "3g.40gb", 4)]),
    ("2/1g.10gb+me@6", [DeviceAssignment(2, 0, "1g.10gb+me", 6)]),
])
def test_devices_annotation_roundtrip(text, devices):
    assert parse_devices(text) == devices
    assert format_devices(devices) == text


@pytest.mark.parametrize("text", ["a", "1:0", "1:1001", "1/3g@"])
def test_devices_annotation_errors(text):
    with pytest.raises(KubeObjectError, match="gpuaas.io/devices"):
        parse_devices(text)


def test_cluster_state_applies_bound_pods():
    nodes = [node("g1", {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "2"},
                  {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "2"})]
    pods = [pod("a", containers=[{"requests": {"cpu": "2"}, "limits": {"nvidia.com/gpu": 1}}],
                annotations={"gpuaas.io/gpu-milli": "300", "gpuaas.io/devices": "1:300"}, node_name="g1"),
            pod("b", containers=[{"requests": {"cpu": "1"}, "limits": {"nvidia.com/gpu": 1}}], node_name="g1"),
            pod("pending", containers=[{"requests": {"cpu": "8"}}])]
    s = cluster_state(nodes, pods)
    # a holds 300 of GPU1 (recorded); b had no annotation -> first free whole GPU, GPU0. CPU 32000 - 2000 - 1000.
    assert s.gpu_left[0, :2].tolist() == [0, 700]
    assert s.cpu_left[0] == 29_000
