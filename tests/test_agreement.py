"""The extender and the node scaler decide with the same code: on the same cluster, the node scaler's what-if
(`place_greedy`) puts every pending pod of a mixed trace slice on the node the extender's filter + prioritize pick for
it, pod after pod (the extender holds each pick, as it does between prioritize and bind)."""
from __future__ import annotations

import numpy as np
import pytest

from extender.metrics import Metrics
from extender.service import ExtenderService
from extender.wire import ExtenderArgs
from gpuaas.workloads import pod_for_demand
from nodescaler.scaleout import place_greedy, placement_order, snapshot_rows
from nodescaler.snapshot import build_snapshot
from scoring.clusterview import ClusterView
from scoring.kubeobjects import pod_key
from scoring.model import PodDemand
from tests.nodescaler.builders import A100X4, A100X8, H100X8, T0, iso, mig_nodes, nodes

SHAPES = [  # (weight, demand): the Alibaba trace's mix in miniature (shares, 1-8 GPUs, CPU-only, a MIG instance)
    (6, PodDemand(cpu_milli=4000, memory_mib=16_384, gpus=1, gpu_milli=1000)),
    (4, PodDemand(cpu_milli=2000, memory_mib=8192, gpus=1, gpu_milli=500)),
    (3, PodDemand(cpu_milli=1000, memory_mib=4096, gpus=1, gpu_milli=250)),
    (1, PodDemand(cpu_milli=16_000, memory_mib=65_536, gpus=2, gpu_milli=1000)),
    (1, PodDemand(cpu_milli=32_000, memory_mib=131_072, gpus=4, gpu_milli=1000)),
    (0.5, PodDemand(cpu_milli=64_000, memory_mib=262_144, gpus=8, gpu_milli=1000)),
    (2, PodDemand(cpu_milli=8000, memory_mib=32_768)),
    (2, PodDemand(cpu_milli=2000, memory_mib=8192, gpus=1, gpu_milli=1000, mig_profile="1g.10gb")),
]


def trace_slice(seed: int, count: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    weights = np.array([w for w, _ in SHAPES], dtype=float)
    out = []
    for i, k in enumerate(rng.choice(len(SHAPES), size=count, p=weights / weights.sum())):
        pod = pod_for_demand(f"p{i:03d}", "team", SHAPES[k][1])
        pod["metadata"].update(uid=f"uid-{i}", creationTimestamp=iso(T0 - 600 + i))
        pod["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                             "reason": "Unschedulable",
                                                             "lastTransitionTime": iso(T0 - 300 + i)}]}
        out.append(pod)
    return out


def sharing(template: dict) -> dict:
    """The template with a sharing device plugin (gpu.shares): the trace's GPU shares may go there (docs/devices.md)."""
    return {**template, "gpu": {**template["gpu"], "shares": True}}


def cluster() -> list[dict]:
    """Four GPU shapes, one of them MIG-partitioned, and a MIG node in the middle of a repartition, whose instances
    the device plugin still advertises: the view both build leaves its GPUs out. The whole-GPU nodes give shares."""
    changing = mig_nodes("changing", 1)
    changing[0]["metadata"]["labels"]["nvidia.com/mig.config.state"] = "pending"
    return (nodes("a100x8", 8, sharing(A100X8)) + nodes("h100x8", 4, sharing(H100X8))
            + nodes("a100x4", 6, sharing(A100X4)) + mig_nodes("mig", 2) + changing)


def time_sliced() -> list[dict]:
    """Six T4 nodes of 2 GPUs, each time-sliced into 4 replicas (issue 16): one-GPU pods take replicas there, shares
    do not fit."""
    return nodes("t4x2", 6, {"gpu": {"model": "T4", "count": 2, "replicas": 4}, "cpu": "32", "memory": "128Gi"})


@pytest.mark.parametrize("seed, count, sliced", [(1, 115, False), (2, 115, False), (2, 140, False), (3, 140, False),
                                                 (1, 130, True), (3, 200, True)])  # 140, 200: more than fits
def test_the_node_scalers_what_if_places_every_pod_where_the_extender_would(seed, count, sliced):
    node_objs, pods = cluster() + (time_sliced() if sliced else []), trace_slice(seed, count)
    by_key = {pod_key(p): p for p in pods}

    snap = build_snapshot(node_objs, pods, [], T0)
    state = snap.state.copy()
    placed, left = place_greedy(state, snap.pending, "gpuaas", snap.workload, snapshot_rows(snap, state))
    what_if = {p.key: state.names[row] for p, row in placed} | {p.key: None for p in left}

    view = ClusterView("gpuaas")
    for n in node_objs:
        view.on_change("Node", None, n)
    for p in pods:
        view.on_change("Pod", None, p)

    async def lookup(namespace, name):
        return by_key.get(f"{namespace}/{name}")

    extender = ExtenderService(view, binder=None, metrics=Metrics(), pod_lookup=lookup)
    names = [n["metadata"]["name"] for n in node_objs]
    picks = {}
    for info in sorted(snap.pending, key=placement_order):
        pod = by_key[info.key]
        feasible = extender.filter(ExtenderArgs(Pod=pod, NodeNames=names)).NodeNames
        picks[info.key] = extender.prioritize(ExtenderArgs(Pod=pod, NodeNames=feasible)).pick if feasible else None

    assert picks == what_if
    shapes = {(p.demand.gpus, p.demand.gpu_milli, p.demand.mig_profile) for p, _ in placed}
    assert len(placed) >= 60 and len(shapes) >= 5  # a mixed slice, not a trivial one
    assert count < 140 or len(left) >= 20  # and pods that fit nowhere, for both
    if sliced:  # and replicas taken on the time-sliced nodes
        assert any(picks[p.key] and picks[p.key].startswith("t4x2-") for p, _ in placed)
