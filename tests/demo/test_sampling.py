"""What the demo records, computed from in-memory objects: GPUs in whole-GPU equivalents, pods by phase,
fragmentation, serving readings per interval, when the cluster has settled, and the final state."""
from __future__ import annotations

import datetime as dt
import math

import pytest

from gpuaas.cluster.local import resolve_pool_spec
from gpuaas.demo.sampling import (
    Serving,
    component_events,
    compute_sample,
    final_state,
    go_duration,
    pod_gpus,
    serving_interval,
    settled,
    slo_counts,
    whole_gpus_free,
)
from gpuaas.demo.timeline import build_timeline, timeline_workload
from gpuaas.workloads import gpu_deployment, gpu_pod
from nodescaler.config import NodeGroupConfig
from nodescaler.provider import render_node
from runtime.pools import node_objects

POOLS = resolve_pool_spec("demo")
WORKLOAD = timeline_workload(build_timeline(60))
NOW = 1_800_000_000.0


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ready(node: dict) -> dict:
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]  # what kwok's node-initialize sets
    return node


def fleet() -> list[dict]:
    return [ready(n) for p in POOLS.pools for n in node_objects(p)]  # 4 A100, 2 H100, 2 MIG A100 nodes: 64 GPUs


def bound(pod: dict, node: str, phase: str = "Running", ready_at: float | None = None) -> dict:
    pod["spec"]["nodeName"] = node
    pod["metadata"].setdefault("namespace", "default")
    pod["status"] = {"phase": phase}
    if ready_at is not None:
        pod["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastTransitionTime": iso(ready_at)}]
    return pod


def pending(pod: dict) -> dict:
    pod["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                         "reason": "Unschedulable"}]}
    return pod


def test_gpu_equivalents():
    a100_mig = next(n for n in fleet() if n["metadata"]["name"].startswith("a100-mig"))
    assert pod_gpus(gpu_pod("w", gpus=4), None) == 4
    assert pod_gpus(gpu_pod("m", mig="1g.10gb"), a100_mig) == pytest.approx(1 / 7)
    assert pod_gpus(gpu_pod("m", mig="3g.40gb"), a100_mig) == pytest.approx(3 / 7)
    assert pod_gpus(gpu_pod("s", gpu_share=250), None) == pytest.approx(0.25)
    with pytest.raises(ValueError, match="no MIG"):
        pod_gpus(gpu_pod("m", mig="1g.10gb"), {"metadata": {"labels": {}}})


def test_sample_of_a_cluster():
    nodes = fleet()
    pods = [bound(gpu_pod("a", gpus=8), "a100-0000"), bound(gpu_pod("b", gpus=1), "a100-0001"),
            bound(gpu_pod("c", mig="1g.10gb"), "a100-mig-0000"),
            bound(gpu_pod("done", gpus=2, complete_after="5s"), "a100-0002", phase="Succeeded"),
            pending(gpu_pod("big", gpus=16))]
    deployment = gpu_deployment("llm", "inference", replicas=3, gpus=1)
    deployment["status"] = {"readyReplicas": 2}
    serving = {"llm": Serving(arrival_rate=4.0, queue_depth=7.0, queue_wait_p99_s=1.5, slo_attainment=0.9)}
    s = compute_sample(12.345, nodes, pods, [deployment], workload=WORKLOAD, serving=serving)
    assert s["t"] == 12.35
    assert (s["nodes"], s["gpu_nodes_ready"], s["gpus_total"]) == (8, 8, 64)
    assert s["gpus_allocated"] == pytest.approx(9 + 1 / 7, abs=1e-4)  # the finished pod holds nothing
    assert s["allocation_ratio"] == pytest.approx((9 + 1 / 7) / 64, abs=1e-4)
    assert (s["pods_running"], s["pods_pending"], s["pods_succeeded"]) == (3, 1, 1)
    assert s["deployments"] == {"llm": {"replicas": 3, "ready": 2, "arrival_rate": 4.0, "queue_depth": 7.0,
                                        "queue_wait_p99_s": 1.5, "slo_attainment": 0.9}}
    # One GPU taken on a node: its 7 free GPUs still take 1-, 2- and 4-GPU pods but not the 8-GPU ones.
    assert 0 < s["fragmentation_ratio"] < 0.2


def test_whole_gpus_free_are_what_a_one_gpu_replica_could_take():
    # 4 A100 and 2 H100 nodes of 8 whole GPUs (the MIG nodes advertise MIG instances, no whole GPU): 48. Held: 8 + 1;
    # a MIG instance holds no whole GPU, a finished pod nothing, a pending one nothing; a booting node adds none yet
    group = NodeGroupConfig.from_pool(next(p for p in POOLS.pools if p.autoscale))
    nodes = fleet() + [ready(render_node(group, "a100-burst-abc", NOW))]
    pods = [bound(gpu_pod("a", gpus=8), "a100-0000"), bound(gpu_pod("b", gpus=1), "a100-0001"),
            bound(gpu_pod("c", mig="1g.10gb"), "a100-mig-0000"),
            bound(gpu_pod("done", gpus=2, complete_after="5s"), "a100-0002", phase="Succeeded"),
            pending(gpu_pod("big", gpus=16))]
    assert whole_gpus_free(nodes, pods) == 48 - 9
    assert whole_gpus_free(nodes, []) == 48


def test_fragmentation_grows_when_pods_are_spread():
    nodes = [n for n in fleet() if n["metadata"]["name"].startswith(("a100-0", "h100"))]
    packed = [bound(gpu_pod(f"p{i}", gpus=1), "a100-0000") for i in range(6)]
    spread = [bound(gpu_pod(f"p{i}", gpus=1), n["metadata"]["name"]) for i, n in enumerate(nodes)]
    empty = compute_sample(0, nodes, [], [], workload=WORKLOAD, serving={})
    a = compute_sample(0, nodes, packed, [], workload=WORKLOAD, serving={})
    b = compute_sample(0, nodes, spread, [], workload=WORKLOAD, serving={})
    assert empty["fragmentation_ratio"] == 0.0
    assert a["gpus_allocated"] == b["gpus_allocated"] == 6
    assert b["fragmentation_ratio"] > a["fragmentation_ratio"]


def test_a_node_still_booting_has_no_gpus_yet():
    group = NodeGroupConfig.from_pool(next(p for p in POOLS.pools if p.autoscale))
    booting = ready(render_node(group, "a100-burst-abc", NOW))  # registered, GPUs not advertised yet
    s = compute_sample(0, fleet() + [booting], [], [], workload=WORKLOAD, serving={})
    assert (s["nodes"], s["gpu_nodes_ready"], s["gpus_total"]) == (9, 8, 64)


def test_serving_interval_in_trace_time():
    nan = math.nan
    arrivals = [0.0, 0.1, 0.2, 0.3, 1.1, 1.2]
    starts = [0.0, 0.1, 0.5, 1.2, 1.1, nan]  # waits 0, 0, 0.3, 0.9 (started after 1.0), 0, not started
    r = serving_interval(arrivals, starts, 0.0, 1.0, arrived_before=0, arrived_now=4, speed=10, slo_s=2.0,
                         queue_depth=3.0)
    # Started in (0, 1]: the requests at 0.1 (wait 0) and 0.2 (wait 0.3 wall = 3 trace seconds); the one started at
    # exactly 0 belongs to the interval before.
    assert r.queue_wait_p99_s == pytest.approx(3.0)
    assert r.slo_attainment == pytest.approx(0.5)
    assert r.arrival_rate == pytest.approx(4 / 10)  # 4 arrivals in 1 wall second = 10 trace seconds
    assert r.queue_depth == 3.0
    later = serving_interval(arrivals, starts, 1.0, 2.0, arrived_before=4, arrived_now=6, speed=10, slo_s=2.0,
                             queue_depth=None)
    assert later.queue_wait_p99_s == pytest.approx(9.0) and later.slo_attainment == pytest.approx(0.5)
    idle = serving_interval([], [], 2.0, 3.0, arrived_before=6, arrived_now=6, speed=10, slo_s=2.0, queue_depth=0)
    assert (idle.queue_wait_p99_s, idle.slo_attainment, idle.arrival_rate) == (None, None, 0.0)


def test_slo_so_far_counts_started_requests():
    assert slo_counts([0.0, 0.1, 0.2, 0.3], [0.0, 0.5, 0.25, math.nan], 0.2) == (2, 3)
    assert slo_counts([], [], 0.2) == (0, 0)


def test_a_node_that_is_not_ready_counts_neither_its_gpus_nor_its_pods():
    nodes = fleet()
    nodes[0]["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]  # its kubelet stopped reporting
    pods = [bound(gpu_pod("a", gpus=8), nodes[0]["metadata"]["name"]), bound(gpu_pod("b", gpus=2), "a100-0001")]
    s = compute_sample(0, nodes, pods, [], workload=WORKLOAD, serving={})
    assert (s["gpu_nodes_ready"], s["gpus_total"], s["gpus_allocated"]) == (7, 56, 2)


def test_settled_names_what_still_moves():
    job = bound(gpu_pod("job", gpus=1, complete_after="20s"), "a100-0000", ready_at=NOW - 10)
    assert "finishes in 10s" in settled([job], [], NOW, quiet_s=30)
    assert settled([job], [], NOW, quiet_s=5) is None  # due after the quiet window
    late = bound(gpu_pod("late", gpus=1, complete_after="20s"), "a100-0000", ready_at=NOW - 60)
    assert settled([late], [], NOW, quiet_s=30) is None  # overdue by more than a moment: not ours to wait for
    starting = bound(gpu_pod("s", gpus=1), "a100-0000", phase="Pending")
    assert "bound and starting" in settled([starting], [], NOW, 30)
    gone = bound(gpu_pod("g", gpus=1), "a100-0000")
    gone["metadata"]["deletionTimestamp"] = iso(NOW)
    assert "terminating" in settled([gone], [], NOW, 30)
    dep = gpu_deployment("llm", "inference", replicas=2, gpus=1)
    replica = bound(gpu_pod("llm-5d9c-x", "inference", gpus=1), "a100-0000")
    replica["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "llm-5d9c"}]
    assert "has 1 of 2 pods" in settled([replica], [dep], NOW, 30)
    dep["spec"]["replicas"] = 1
    assert settled([replica], [dep], NOW, 30) is None


def test_final_state():
    nodes = fleet()
    pods = [bound(gpu_pod("a", "training", gpus=8), "a100-0000"),
            bound(gpu_pod("m", "inference", mig="2g.20gb"), "a100-mig-0001"),
            bound(gpu_pod("done", "training", gpus=2), "a100-0001", phase="Succeeded"),
            pending(gpu_pod("big", "training", gpus=16))]
    dep = gpu_deployment("llm", "inference", replicas=3, gpus=1)
    final = final_state(nodes, pods, [dep], {"training/big": "0/8 nodes are available: 8 Insufficient nvidia.com/gpu."})
    assert (final["nodes"], final["gpus_total"]) == (8, 64)
    assert final["gpus_allocated"] == pytest.approx(8 + 2 / 7, abs=1e-4)
    assert (final["pods_running"], final["pods_pending"], final["pods_succeeded"]) == (2, 1, 1)
    assert final["replicas"] == {"inference/llm": 3}
    assert final["pending"] == [{"pod": "training/big", "reason": "0/8 nodes are available: 8 Insufficient "
                                                                "nvidia.com/gpu.", "request": "gpu=16"}]
    assert final["placements"] == [
        {"pod": "inference/m", "node": "a100-mig-0001", "gpu": "NVIDIA-A100-SXM4-80GB", "request": "mig-2g.20gb=1"},
        {"pod": "training/a", "node": "a100-0000", "gpu": "NVIDIA-A100-SXM4-80GB", "request": "gpu=8"}]
    by_name = {n["name"]: n for n in final["gpu_nodes"]}
    assert by_name["a100-0000"] == {"name": "a100-0000", "pool": "a100", "gpus_total": 8, "gpus_allocated": 8,
                                    "whole_gpus": 8}
    assert by_name["a100-mig-0001"]["whole_gpus"] == 0
    assert by_name["a100-0001"]["gpus_allocated"] == 0


def test_component_events_are_the_autoscalers_once_each():
    def event(uid, component, reason, t, ns="inference", kind="Deployment", name="llm"):
        return {"metadata": {"uid": uid}, "source": {"component": component}, "reason": reason, "message": "m",
                "lastTimestamp": iso(t), "involvedObject": {"kind": kind, "name": name, "namespace": ns}}

    seen: set[str] = set()
    events = [event("1", "gpuaas-autoscaler", "ScaleUp", NOW + 5), event("2", "default-scheduler", "Scheduled", NOW),
              event("3", "gpuaas-nodescaler", "NodeRemoved", NOW + 2, ns=None, kind="Node", name="n1")]
    out = component_events(events, seen, NOW)
    assert [(e["t"], e["kind"], e["object"]) for e in out] == [(2.0, "NodeRemoved", "node/n1"),
                                                              (5.0, "ScaleUp", "inference/llm")]
    assert component_events(events, seen, NOW) == []


def test_go_durations():
    assert go_duration("12s") == 12 and go_duration("1m30s") == 90 and go_duration("500ms") == 0.5
    assert go_duration("1h") == 3600
    for bad in ("12", "s", "1x", ""):
        if bad:
            with pytest.raises(ValueError):
                go_duration(bad)


def _member(name, gang, *, created, scheduled=None, ready=None, phase="Pending"):
    conditions = []
    if scheduled is not None:
        conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": _iso(scheduled)})
    if ready is not None:
        conditions.append({"type": "Ready", "status": "True", "lastTransitionTime": _iso(ready)})
    return {"metadata": {"name": name, "namespace": "training", "labels": {"gpuaas.io/gang": gang},
                         "creationTimestamp": _iso(created)},
            "spec": {}, "status": {"phase": phase, "conditions": conditions}}


def _iso(t):
    import datetime as dt
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_gang_report_times_each_gang_and_its_half_placed_stretch():
    from gpuaas.demo.sampling import gang_report

    t0 = 1_800_000_000
    pods = [_member("a-0", "a", created=t0, scheduled=t0 + 2, ready=t0 + 3, phase="Running"),
            _member("a-1", "a", created=t0, scheduled=t0 + 2, ready=t0 + 4, phase="Running"),
            _member("b-0", "b", created=t0 + 10, scheduled=t0 + 11, ready=t0 + 11, phase="Succeeded"),
            _member("b-1", "b", created=t0 + 10, scheduled=t0 + 40, ready=t0 + 41, phase="Running"),
            _member("c-0", "c", created=t0 + 20, scheduled=t0 + 21, ready=t0 + 21, phase="Running"),
            _member("c-1", "c", created=t0 + 20)]
    report = {g["gang"]: g for g in gang_report(pods, {"a": 2, "b": 2, "c": 2, "d": 3}, "gpuaas.io/gang", t0 + 100)}
    assert (report["a"]["all_bound_after_s"], report["a"]["all_running_after_s"], report["a"]["half_placed_s"]) == \
        (2, 4, 0)
    assert (report["b"]["all_bound_after_s"], report["b"]["half_placed_s"]) == (30, 29)  # one bound, one waited
    assert (report["c"]["all_bound_after_s"], report["c"]["half_placed_s"]) == (None, 79)  # half-placed to the end
    assert (report["d"]["members"], report["d"]["bound"], report["d"]["half_placed_s"]) == (0, 0, None)
