"""The extender's model of the cluster: informer events in, GPUs held out; assumptions confirmed or expired."""
from __future__ import annotations

import asyncio

import pytest

from extender.binder import BindError
from extender.metrics import Metrics
from extender.service import ExtenderService
from extender.wire import ExtenderArgs, ExtenderBindingArgs
from scoring.clusterview import ClusterView
from scoring.model import MILLI
from tests.conftest import Clock

from .fixtures import bound, names, nodes, pending


def view_with_nodes(clock=None) -> ClusterView:
    view = ClusterView("gpuaas", assume_ttl=30, clock=clock or Clock())
    for n in nodes():
        view.on_change("Node", None, n)
    return view


def free_gpus(view: ClusterView, node: str) -> int:
    state, _ = view.snapshot()
    return int((state.gpu_left[state.index[node]] == MILLI).sum())


def test_bound_pods_hold_their_recorded_gpus_and_release_them_when_deleted():
    view = view_with_nodes()
    pod = bound(pending("train", gpus=4), "a100-0001", "2,3,4,5")
    view.on_change("Pod", None, pod)
    state, _ = view.snapshot()
    assert state.gpu_left[state.index["a100-0001"]].tolist() == [1000, 1000, 0, 0, 0, 0, 1000, 1000]
    view.on_change("Pod", pod, None)
    assert free_gpus(view, "a100-0001") == 8


def test_finished_pods_give_their_gpus_back():
    view = view_with_nodes()
    pod = bound(pending("job", gpus=8), "a100-0000")
    view.on_change("Pod", None, pod)
    assert free_gpus(view, "a100-0000") == 0
    view.on_change("Pod", pod, {**pod, "status": {"phase": "Succeeded"}})
    assert free_gpus(view, "a100-0000") == 8


def test_a_pod_bound_past_gpuaas_where_its_gpus_are_not_free_is_counted_and_holds_its_cpu_and_memory():
    # Bound by someone else (no gpuaas.io/devices) to a node whose model has 2 whole GPUs left: the policy has no 4
    # GPUs to give it, so the view counts it as unreadable, leaves the node's GPUs as they were and holds the CPU and
    # memory the pod surely takes.
    view = view_with_nodes()
    view.on_change("Pod", None, bound(pending("big", gpus=6), "a100-0001", "0,1,2,3,4,5"))
    view.on_change("Pod", None, bound(pending("past", gpus=4), "a100-0001"))
    assert free_gpus(view, "a100-0001") == 2  # (the model is built here, and the pods placed)
    assert view.parse_errors == 1 and "ml/big" in view.placements
    assert view.placements["ml/past"].demand.gpus == 0 and view.placements["ml/past"].demand.cpu_milli == 1000


def test_node_heartbeats_do_not_rebuild_the_model():
    view = view_with_nodes()
    view.snapshot()
    node = nodes()[0]
    beat = {**node, "status": {**node["status"], "conditions": [{"type": "Ready", "status": "True"}]}}
    view.on_change("Node", node, beat)
    view.snapshot()
    assert view.rebuilds == 1


@pytest.mark.parametrize("rebuilt", [False, True], ids=["row-removed", "rebuilt"])
def test_a_rebuilt_model_scores_as_one_that_took_its_pods_one_by_one(rebuilt):
    """A rebuild re-places every pod and only then makes the policy's node tables (once, not after each pod); a node
    removed in place drops its row from both: either way the scores are those of a model that took the same pods one
    by one."""
    import numpy as np

    pods = [bound(pending("a", gpus=4), "a100-0001", "2,3,4,5"), bound(pending("b", gpus=1), "a100-0000"),
            bound(pending("c", gpus=2), "a100-0002", "0,1")]
    view = view_with_nodes()
    for p in pods:
        view.on_change("Pod", None, p)
    view.snapshot()
    gone = nodes()[-1]
    view.on_change("Node", gone, None)  # a node removed: its row goes
    if rebuilt:
        view._dirty = True  # what the node scaler sets after a change it could not apply: the model is rebuilt
    state, policy = view.snapshot()
    assert view.rebuilds == (2 if rebuilt else 1)

    fresh = ClusterView("gpuaas", assume_ttl=30, clock=Clock())
    for n in nodes()[:-1]:
        fresh.on_change("Node", None, n)
    fresh.snapshot()
    for p in pods:  # into the built model: each pod placed and its node's tables refreshed, one by one
        fresh.on_change("Pod", None, p)
    fresh_state, fresh_policy = fresh.snapshot()
    demand = view.demand(pending("next", gpus=2))
    everywhere = np.ones(len(state), dtype=bool)
    assert np.array_equal(state.gpu_left, fresh_state.gpu_left)
    assert np.array_equal(policy.score(state, demand, everywhere), fresh_policy.score(fresh_state, demand, everywhere))


def test_assumption_is_kept_until_confirmed_and_dropped_after_its_ttl(clock):
    view = view_with_nodes(clock)
    _state, _ = view.snapshot()
    demand = view.demand(pending("p", gpus=8))
    view.assume("ml/p", "a100-0002", demand, tuple(range(8)))
    assert free_gpus(view, "a100-0002") == 0
    # The pod's own update (no nodeName yet) must not release what bind holds.
    view.on_change("Pod", None, pending("p", gpus=8))
    assert free_gpus(view, "a100-0002") == 0
    clock.t = 31
    assert free_gpus(view, "a100-0002") == 8  # never confirmed: released

    view.assume("ml/p", "a100-0002", demand, tuple(range(8)))
    view.on_change("Pod", None, bound(pending("p", gpus=8), "a100-0002", "0,1,2,3,4,5,6,7"))
    clock.t = 100
    assert free_gpus(view, "a100-0002") == 0  # confirmed by the watch: no expiry
    assert view.stats()["assumed"] == 0


class RecordingBinder:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, str, dict]] = []
        self.fail = fail

    async def bind(self, namespace, name, uid, node, annotations):
        self.calls.append((name, node, annotations))
        if self.fail:
            raise BindError("apiserver said no")


def service(view, binder, pods):
    async def lookup(ns, name):
        return pods.get(f"{ns}/{name}")
    return ExtenderService(view, binder, Metrics(), lookup)


def test_a_burst_of_binds_never_double_books_a_gpu():
    """Ten 1-GPU pods bound to one 8-GPU node before any watch event: eight get distinct GPUs, two are refused."""
    view = view_with_nodes()
    pods = {f"ml/b{i}": pending(f"b{i}", gpus=1) for i in range(10)}
    binder = RecordingBinder()
    svc = service(view, binder, pods)

    async def burst():
        return [await svc.bind(ExtenderBindingArgs(PodName=f"b{i}", PodNamespace="ml", PodUID=f"uid-b{i}",
                                                    Node="h100-0000")) for i in range(10)]

    results = asyncio.run(burst())
    devices = [c[2]["gpuaas.io/devices"] for c in binder.calls]
    assert len(devices) == 4 == len(set(devices))  # h100-0000 has 4 GPUs
    refused = [r.Error for r in results if r.Error]
    assert len(refused) == 6 and all("no longer fits on h100-0000" in e for e in refused)


def test_prioritize_holds_its_pick_and_bind_moves_it_where_the_scheduler_chose():
    view = view_with_nodes()
    pods = {"ml/p": pending("p", gpus=4)}
    svc = service(view, RecordingBinder(), pods)
    scored = svc.prioritize(ExtenderArgs(Pod=pods["ml/p"], NodeNames=["h100-0000", "h100-0001"])).pairs()
    pick = max(scored, key=lambda hs: hs[1])[0]
    other = "h100-0001" if pick == "h100-0000" else "h100-0000"
    assert sorted(s for _, s in scored) == [9, 10]  # a tie at the top is ranked, so the scheduler follows
    assert free_gpus(view, pick) == 0
    result = asyncio.run(svc.bind(ExtenderBindingArgs(PodName="p", PodNamespace="ml", PodUID="uid-p", Node=other)))
    assert result.Error == ""
    assert free_gpus(view, pick) == 4 and free_gpus(view, other) == 0


def test_failed_bind_releases_the_gpus():
    view = view_with_nodes()
    pods = {"ml/p": pending("p", gpus=8)}
    svc = service(view, RecordingBinder(fail=True), pods)
    result = asyncio.run(svc.bind(ExtenderBindingArgs(PodName="p", PodNamespace="ml", PodUID="uid-p",
                                                      Node="a100-0000")))
    assert "apiserver said no" in result.Error
    assert free_gpus(view, "a100-0000") == 8


def test_unreadable_nodes_are_unresolvable_with_the_reason():
    view = view_with_nodes()
    broken = nodes()[0]
    broken["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-Z9000"
    view.on_change("Node", nodes()[0], broken)
    svc = service(view, RecordingBinder(), {})
    result = svc.filter(ExtenderArgs(Pod=pending("p", gpus=1), NodeNames=names()))
    assert "unknown GPU model 'NVIDIA-Z9000'" in result.FailedAndUnresolvableNodes["a100-0000"]


def test_bind_on_the_picked_node_uses_the_devices_prioritize_held():
    view = view_with_nodes()
    pods = {"ml/p": pending("p", gpus=2)}
    binder = RecordingBinder()
    svc = service(view, binder, pods)
    scored = svc.prioritize(ExtenderArgs(Pod=pods["ml/p"], NodeNames=["a100-0001"])).pairs()
    held = view.placements["ml/p"].devices
    asyncio.run(svc.bind(ExtenderBindingArgs(PodName="p", PodNamespace="ml", PodUID="uid-p", Node="a100-0001")))
    assert scored == [("a100-0001", 10)]
    assert binder.calls == [("p", "a100-0001", {"gpuaas.io/devices": ",".join(map(str, held))})]
    assert free_gpus(view, "a100-0001") == 6


def test_bind_where_prioritize_held_keeps_the_hold_and_renews_its_time_to_live(clock):
    """The usual bind: kube-scheduler chose the node prioritize held GPUs on. The hold is kept as it is (the same
    devices, the node's model as forget and assume would leave it) and lives assume_ttl from the bind, not from
    prioritize."""
    view = view_with_nodes(clock)
    pods = {"ml/p": pending("p", gpus=2)}
    binder = RecordingBinder()
    svc = service(view, binder, pods)
    svc.prioritize(ExtenderArgs(Pod=pods["ml/p"], NodeNames=["a100-0001"]))
    held = view.placements["ml/p"].devices
    state, _ = view.snapshot()
    before = state.gpu_left.copy(), state.cpu_left.copy(), state.mem_left.copy()
    clock.t = 20
    asyncio.run(svc.bind(ExtenderBindingArgs(PodName="p", PodNamespace="ml", PodUID="uid-p", Node="a100-0001")))
    assert binder.calls == [("p", "a100-0001", {"gpuaas.io/devices": ",".join(map(str, held))})]
    state, _ = view.snapshot()
    assert all((a == b).all() for a, b in zip(before, (state.gpu_left, state.cpu_left, state.mem_left), strict=True))
    clock.t = 45  # 30 s after prioritize, 25 s after bind
    assert free_gpus(view, "a100-0001") == 6
    clock.t = 51
    assert free_gpus(view, "a100-0001") == 8  # never confirmed by the watch: released assume_ttl after bind


def test_bind_where_prioritize_held_refuses_once_the_node_no_longer_fits_the_pod():
    """A pod bound past gpuaas took the node's CPU after prioritize held GPUs there: the pod does not fit without its
    hold, so bind refuses it and gives the GPUs back, as when it is bound elsewhere."""
    view = view_with_nodes()
    pods = {"ml/p": pending("p", gpus=2, cpu="8")}
    binder = RecordingBinder()
    svc = service(view, binder, pods)
    svc.prioritize(ExtenderArgs(Pod=pods["ml/p"], NodeNames=["a100-0001"]))
    assert free_gpus(view, "a100-0001") == 6
    view.on_change("Pod", None, bound(pending("hog", gpus=1, cpu="125"), "a100-0001", "7"))
    result = asyncio.run(svc.bind(ExtenderBindingArgs(PodName="p", PodNamespace="ml", PodUID="uid-p",
                                                      Node="a100-0001")))
    assert "no longer fits on a100-0001: insufficient cpu (8000m requested)" in result.Error
    assert binder.calls == [] and free_gpus(view, "a100-0001") == 7


def test_a_filter_body_cannot_change_what_bind_and_the_informer_believe_a_pod_asks_for():
    """Defect 5: a /filter body carrying a victim's uid and generation but no containers once filled the demand cache
    that bind and the informer read, and the victim's 2-GPU pod then counted as using nothing."""
    view = view_with_nodes()
    victim = pending("victim", gpus=2)
    victim["metadata"]["generation"] = 1
    pods = {"ml/victim": victim}
    binder = RecordingBinder()
    svc = service(view, binder, pods)
    forged = {"metadata": {"name": "victim", "namespace": "ml", "uid": "uid-victim", "generation": 1},
              "spec": {"containers": []}}
    svc.filter(ExtenderArgs(Pod=forged, NodeNames=names()))
    # bind reads the pod the apiserver holds: it holds 2 GPUs, not 0
    result = asyncio.run(svc.bind(ExtenderBindingArgs(PodName="victim", PodNamespace="ml", PodUID="uid-victim",
                                                      Node="a100-0001")))
    assert result.Error == "" and len(binder.calls[0][2]["gpuaas.io/devices"].split(",")) == 2
    assert free_gpus(view, "a100-0001") == 6
    # the informer reading that pod, bound by someone else (no devices note), after another forged filter
    view = view_with_nodes()
    svc = service(view, binder, pods)
    svc.filter(ExtenderArgs(Pod=forged, NodeNames=names()))
    view.on_change("Pod", None, bound(victim, "a100-0002"))
    assert free_gpus(view, "a100-0002") == 6


def test_a_prioritize_body_naming_a_bound_pod_does_not_move_its_gpus():
    """A request body is not the informer: prioritize for a pod the watch shows bound holds nothing for it (it once
    released the bound pod's GPUs to hold the body's guess elsewhere)."""
    view = view_with_nodes()
    view.on_change("Pod", None, bound(pending("busy", gpus=6), "a100-0000", "0,1,2,3,4,5"))
    svc = service(view, RecordingBinder(), {})
    svc.prioritize(ExtenderArgs(Pod=pending("busy", gpus=1), NodeNames=["h100-0000"]))
    assert free_gpus(view, "a100-0000") == 2 and free_gpus(view, "h100-0000") == 4


def test_a_pod_whose_accepted_models_change_is_read_anew():
    """Keyed on content, the demand cache sees what a uid and generation do not: annotations change without a new
    generation."""
    view = view_with_nodes()
    pod = pending("p", gpus=1)
    pod["metadata"]["generation"] = 1
    assert view.demand(pod).allowed_models == frozenset()
    pod["metadata"]["annotations"] = {"gpuaas.io/gpu-models": "H100-80GB"}
    assert view.demand(pod).allowed_models == {"H100-80GB"}


def test_bind_uses_the_gpus_a_gang_release_planned_while_they_are_free():
    """A gang's members carry the GPUs the gang controller planned together (gpuaas.io/planned-devices); another
    choice can leave a later member of the same node without room (seen in bench/gang_replay.py)."""
    view = view_with_nodes()
    planned = pending("p", gpus=2)
    planned["metadata"]["annotations"]["gpuaas.io/planned-devices"] = "a100-0001:5,7"
    elsewhere = pending("q", gpus=2)
    elsewhere["metadata"]["annotations"]["gpuaas.io/planned-devices"] = "a100-0002:5,7"
    taken = pending("r", gpus=1)
    taken["metadata"]["annotations"]["gpuaas.io/planned-devices"] = "a100-0001:7"  # 7 is p's by then
    pods = {"ml/p": planned, "ml/q": elsewhere, "ml/r": taken}
    binder = RecordingBinder()
    svc = service(view, binder, pods)
    for name in ("p", "q", "r"):
        asyncio.run(svc.bind(ExtenderBindingArgs(PodName=name, PodNamespace="ml", PodUID=f"uid-{name}",
                                                 Node="a100-0001")))
    devices = {c[0]: c[2]["gpuaas.io/devices"] for c in binder.calls}
    assert devices["p"] == "5,7"  # as planned
    assert devices["q"] != "5,7" and len(devices["q"].split(",")) == 2  # planned for another node: the policy's
    assert devices["r"] not in ("5", "7")  # planned GPU taken: the policy's choice


def test_gated_pods_are_not_queued_and_pinned_pods_are_queued_with_their_node():
    view = view_with_nodes()
    gated = pending("g", gpus=1)
    gated["spec"]["schedulingGates"] = [{"name": "gpuaas.io/gang"}]
    view.on_change("Pod", None, gated)
    assert "ml/g" not in view.queue
    released = {**gated, "spec": {**gated["spec"], "schedulingGates": [],
                                  "nodeSelector": {"kubernetes.io/hostname": "a100-0001"}}}
    view.on_change("Pod", gated, released)
    assert view.queue["ml/g"].pinned == "a100-0001" and list(view.pinned) == ["ml/g"]
    view.snapshot()
    assert view.rows_by_hostname()["a100-0001"] == view.state.index["a100-0001"]


def test_a_pod_whose_named_gpus_another_pod_holds_takes_free_ones_and_gives_back_what_it_took():
    # Its annotation names GPUs 0 and 1, which `big` holds: the model places it on two free GPUs instead, and when
    # both pods go the node is whole again (a refused place used to keep the CPU, memory and GPUs it had taken).
    view = view_with_nodes()
    big = bound(pending("big", gpus=6), "a100-0001", "0,1,2,3,4,5")
    past = bound(pending("past", gpus=2), "a100-0001", "0,1")
    view.on_change("Pod", None, big)
    view.snapshot()
    state, _ = view.snapshot()
    row = state.index["a100-0001"]
    cpu, mem = int(state.cpu_left[row]), int(state.mem_left[row])
    view.on_change("Pod", None, past)
    assert view.parse_errors == 1 and view.placements["ml/past"].devices == (6, 7)
    assert free_gpus(view, "a100-0001") == 0
    view.on_change("Pod", big, None)
    view.on_change("Pod", past, None)
    state, _ = view.snapshot()
    assert free_gpus(view, "a100-0001") == 8
    assert int(state.cpu_left[row]) > cpu and int(state.mem_left[row]) > mem
    assert int(state.cpu_left[row]) == state.nodes[row].cpu_milli
    assert int(state.mem_left[row]) == state.nodes[row].memory_mib


def test_a_pod_bound_where_no_gpu_is_left_is_held_with_its_cpu_and_memory_and_gives_them_back():
    view = view_with_nodes()
    full = bound(pending("full", gpus=8), "a100-0001", "0,1,2,3,4,5,6,7")
    past = bound(pending("past", gpus=1, cpu="7"), "a100-0001", "3")
    view.on_change("Pod", None, full)
    view.snapshot()
    view.on_change("Pod", None, past)
    state, _ = view.snapshot()
    row = state.index["a100-0001"]
    assert view.placements["ml/past"].demand.gpus == 0 and view.placements["ml/past"].devices == ()
    assert (state.gpu_left[row] == 0).all()  # not below 0: the node still takes no GPU pod, and no place raises
    view.on_change("Pod", full, None)
    assert free_gpus(view, "a100-0001") == 8
    state, _ = view.snapshot()
    assert int(state.cpu_left[row]) == state.nodes[row].cpu_milli - 7000
    view.on_change("Pod", past, None)
    state, _ = view.snapshot()
    assert int(state.cpu_left[row]) == state.nodes[row].cpu_milli
