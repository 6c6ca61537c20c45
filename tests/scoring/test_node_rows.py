"""A node added, removed or read anew changes its own row of the model and of the policy's tables in place
(ClusterState.insert_node, delete_node, reset_node; ClusterView applies them at the next snapshot). The oracle is the
full rebuild: after random sequences of node and pod events, the model updated in place must equal a copy of the same
view that builds it anew at that point (every state array and list, the policy's tables), and answer filter and
prioritize as that copy does. A wrong in-place update (a column missed, a row shifted, pods placed in another order,
tables not refreshed or not reweighed) makes these differ."""
from __future__ import annotations

import copy
import functools
import random
from typing import Any

import numpy as np
import pytest

from runtime.pools import parse_pool_spec, spec_node_objects
from scoring import verdicts
from scoring.clusterview import ClusterView
from scoring.fit import feasible
from scoring.fragmentation import Workload
from scoring.kubeobjects import node_spec
from scoring.model import MILLI, ClusterState, PodDemand
from scoring.policies import FgdPolicy, GpuaasPolicy
from tests.conftest import Clock
from tests.extender.fixtures import bound, pending

POOLS = {"pools": [
    {"name": "a100", "count": 3, "gpu": {"model": "A100-80GB", "count": 8, "shares": True}, "cpu": "64",
     "memory": "512Gi"},
    {"name": "h100", "count": 3, "gpu": {"model": "H100-80GB", "count": 4}, "cpu": "96", "memory": "1Ti"},
    {"name": "mig", "count": 2, "gpu": {"model": "A100-80GB", "count": 8, "mig": "all-balanced"}, "cpu": "128",
     "memory": "1Ti"},
    {"name": "l40s", "count": 2, "gpu": {"model": "L40S", "count": 4, "replicas": 4}, "cpu": "32", "memory": "256Gi"},
    {"name": "cpu", "count": 2, "cpu": "64", "memory": "256Gi"},
]}

# A workload with shapes restricted to one GPU model: every node of that model in or out reweighs the tables.
RESTRICTED = Workload.typical([
    PodDemand(cpu_milli=4000, memory_mib=16384, gpus=1, gpu_milli=MILLI),
    PodDemand(cpu_milli=8000, memory_mib=65536, gpus=2, gpu_milli=MILLI, allowed_models=frozenset({"H100-80GB"})),
    PodDemand(cpu_milli=2000, memory_mib=8192, gpus=1, gpu_milli=300),
    PodDemand(cpu_milli=1000, memory_mib=4096),
])
PLAIN = Workload.typical([PodDemand(cpu_milli=4000, memory_mib=16384, gpus=1, gpu_milli=MILLI),
                          PodDemand(cpu_milli=2000, memory_mib=8192, gpus=1, gpu_milli=500)])

# What filter and prioritize are asked for after each step.
ASKED: list[dict[str, Any]] = [
    {"gpus": 1, "cpu": "2", "memory": "8Gi"}, {"gpus": 2, "cpu": "4", "memory": "16Gi"}, {"gpus": 8, "cpu": "8"},
    {"gpu_share": 300, "cpu": "1"}, {"mig": "1g.10gb", "cpu": "1"}, {"mig": "3g.40gb"}, {"cpu": "16", "memory": "64Gi"},
]


@functools.cache
def universe() -> dict[str, dict[str, Any]]:
    """Every node a sequence may add, by name (not changed: changed nodes are copies)."""
    return {n["metadata"]["name"]: n for n in spec_node_objects(parse_pool_spec(POOLS))}


def renamed(node: dict[str, Any], name: str) -> dict[str, Any]:
    """`node`'s pool (GPUs, capacity, labels) under another node's name: that node read anew with another spec."""
    out = copy.deepcopy(node)
    out["metadata"]["name"] = name
    out["metadata"]["labels"]["kubernetes.io/hostname"] = name
    return out


# What a row holds for its spec, whatever its pods did.
SPEC_ARRAYS = ("cpu_cap", "mem_cap", "gpu_count", "replicas", "replica_milli", "time_sliced", "share_nodes", "dra_rows",
               "model_idx", "gpu_exists", "block")


def assert_same_state(a: ClusterState, b: ClusterState, murky: frozenset[str] = frozenset()) -> None:
    """Equal models; on the rows of `murky` nodes only what their specs make (see `murky`)."""
    assert a.names == b.names and a.index == b.index and a.nodes == b.nodes
    assert a.model_names == b.model_names and a.mig_profiles == b.mig_profiles and a.mig_pos == b.mig_pos
    clear = np.array([name not in murky for name in a.names], dtype=bool)
    for key in ClusterState.ROW_ARRAYS:
        x, y = getattr(a, key), getattr(b, key)
        assert x.dtype == y.dtype, key
        assert np.array_equal(x, y) if key in SPEC_ARRAYS else np.array_equal(x[clear], y[clear]), key
    assert (a.any_time_sliced, a.all_share_nodes, a.any_dra) == (b.any_time_sliced, b.all_share_nodes, b.any_dra)
    rows = np.flatnonzero(clear).tolist()
    assert [a.mig_instances[r] for r in rows] == [b.mig_instances[r] for r in rows]
    # Per node as a multiset: the order pods were placed on a node follows the events (a pod re-placed when its
    # binding shows other devices goes last), not the order a rebuild re-places them in, whatever the node set did.
    assert [sorted(a.pods_on[r], key=repr) for r in rows] == [sorted(b.pods_on[r], key=repr) for r in rows]


def murky(view: ClusterView) -> frozenset[str]:
    """Nodes holding a pod the model could not account (bound where its devices are not free: its node was read anew
    with fewer GPUs, or the pod was bound past gpuaas). ClusterState.place takes part of such a pod before it
    refuses, and a pod bound without devices gets other GPUs at each rebuild: what such a row holds depends on the
    history of its pods, and two rebuilds in a row can differ there. Its spec does not."""
    return frozenset(b.node for k, b in view.pods.items() if k not in view.placements)


def assert_same_tables(p: Any, q: Any, clear: np.ndarray) -> None:
    assert type(p) is type(q)
    if isinstance(p, FgdPolicy):
        for key in ("acc", "count", "usable", "idle", "frag"):
            assert np.array_equal(getattr(p.index, key)[clear], getattr(q.index, key)[clear]), key
        assert np.array_equal(p.index.p, q.index.p)
    if isinstance(p, GpuaasPolicy):
        assert p.cpu_per_gpu_milli == q.cpu_per_gpu_milli


def assert_same_answers(view: ClusterView, oracle: ClusterView, unclear: frozenset[str]) -> None:
    state, policy = view.snapshot()
    o_state, o_policy = oracle.snapshot()
    names = [n for n in universe() if n not in unclear] + ["not-a-node"]
    for i, asked in enumerate(ASKED):
        demand = view.demand(pending(f"asked-{i}", **asked))
        got = verdicts.filter_nodes(state, demand, names, view.bad_nodes)
        want = verdicts.filter_nodes(o_state, demand, names, oracle.bad_nodes)
        assert (got.feasible, got.failed, got.unresolvable) == (want.feasible, want.failed, want.unresolvable), asked
        mine = verdicts.prioritize(state, policy, demand, got.feasible)
        theirs = verdicts.prioritize(o_state, o_policy, demand, want.feasible)
        assert mine.pick == theirs.pick and np.array_equal(mine.scores, theirs.scores), asked


def rebuilding_copy(view: ClusterView) -> ClusterView:
    """A view holding what `view` holds (nodes, bound pods in their order, placements and assumptions) that builds
    its model anew at its first snapshot, from what a rebuild reads."""
    oracle = ClusterView(view.policy_name, assume_ttl=view.assume_ttl, clock=view.clock, workload=view.fixed_workload)
    oracle.nodes, oracle.specs, oracle.bad_nodes = dict(view.nodes), dict(view.specs), dict(view.bad_nodes)
    for pod in view.pods.values():
        oracle._keep_pod(pod)
    for key, placement in view.placements.items():
        oracle._record(key, placement)
    oracle.assumed = dict(view.assumed)
    oracle.recent, oracle._demands = view.recent.copy(), dict(view._demands)
    return oracle


def check_against_rebuild(view: ClusterView) -> None:
    """The view's model after its pending node changes, against a copy of it that builds the model anew."""
    oracle = rebuilding_copy(view)
    state, policy = view.snapshot()
    o_state, o_policy = oracle.snapshot()
    unclear = murky(view) | murky(oracle)
    assert_same_state(state, o_state, unclear)
    assert_same_tables(policy, o_policy, np.array([name not in unclear for name in state.names], dtype=bool))
    assert ({k: p for k, p in view.placements.items() if p.node not in unclear}
            == {k: p for k, p in oracle.placements.items() if p.node not in unclear})
    assert ({k for k in view.assumed if view.placements[k].node not in unclear}
            == {k for k in oracle.assumed if oracle.placements[k].node not in unclear})
    assert_same_answers(view, oracle, unclear)
    assert len(unclear & set(state.names)) <= len(state) // 2  # most rows compared in full


class Events:
    """Random node and pod events on one view, as informers and the extender's bind would deliver them."""

    def __init__(self, view: ClusterView, seed: int):
        self.view = view
        self.rng = random.Random(seed)
        self.all = universe()
        self.present: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}  # bound pods by name
        self.foreign_on: set[str] = set()  # nodes holding GPU pods bound without gpuaas.io/devices
        self.serial = 0

    def node(self, name: str, obj: dict[str, Any] | None) -> None:
        old = self.present.get(name)
        if obj is None:
            self.present.pop(name, None)
        else:
            self.present[name] = obj
        self.view.on_change("Node", old, obj)

    def pod_name(self) -> str:
        self.serial += 1
        return f"p{self.serial}"

    def bind(self, pod: dict[str, Any], node: str, devices: str | None = None) -> None:
        obj = bound(pod, node, devices)
        self.pods[obj["metadata"]["name"]] = obj
        self.view.on_change("Pod", None, obj)

    def gpu_pod_with_devices(self) -> None:
        """A pod gpuaas bound: its GPUs are the free ones of a node the model has."""
        state, _ = self.view.snapshot()
        name = self.rng.choice(list(self.present))
        row = state.index.get(name)
        if row is None or not state.gpu_count[row]:
            return
        kind = self.rng.choice(("whole", "share", "mig"))
        if kind == "mig":
            free = [(g, p) for (g, p) in zip(*np.nonzero(state.mig_free[row]), strict=True)]
            if not free:
                return
            g, p = self.rng.choice(free)
            self.bind(pending(self.pod_name(), mig=state.mig_profiles[p]), name, str(g))
        elif kind == "share" and state.share_nodes[row]:
            free = np.flatnonzero(state.gpu_left[row] >= 300).tolist()
            if free:
                self.bind(pending(self.pod_name(), gpu_share=300, cpu="1"), name, str(self.rng.choice(free)))
        else:
            unit = int(state.replica_milli[row])
            free = [g for g in range(int(state.gpu_count[row])) if state.gpu_left[row, g] >= unit
                    and (unit < MILLI or state.gpu_left[row, g] == MILLI)]
            k = self.rng.choice((1, 2))
            if len(free) >= k:
                devices = ",".join(str(g) for g in sorted(self.rng.sample(free, k)))
                self.bind(pending(self.pod_name(), gpus=k, cpu="2", memory="8Gi"), name, devices)

    def foreign_gpu_pod(self) -> None:
        """A pod bound past gpuaas (no devices): the policy chooses its GPUs, on a node the model may not have yet.
        Such pods are never deleted, nor the GPU pods of their node: a rebuild re-places them in the order they
        arrived, without the pods that left in between, and would choose other GPUs (as any rebuild does)."""
        name = self.rng.choice([n for n in self.all if n.startswith(("a100", "h100"))])
        self.foreign_on.add(name)
        self.bind(pending(self.pod_name(), gpus=1, cpu="1"), name)

    def cpu_pod(self) -> None:
        self.bind(pending(self.pod_name(), cpu=self.rng.choice(("1", "4")), memory="2Gi"),
                  self.rng.choice(list(self.all)))

    def delete_pod(self) -> None:
        """A bound pod deleted. Not a MIG pod (its annotation names the GPU, and which of the GPU's instances of its
        profile the model gives the next one depends on which were freed before), nor a GPU pod of a node holding
        pods bound without devices (which GPUs those hold depends on which pods came and went before). That history
        is the pod events', kept as it is by a node's row changing in place, and thrown away by a rebuild."""
        deletable = [p for p in self.pods.values() if not self.view.demand(p).mig_profile and (
            p["spec"]["nodeName"] not in self.foreign_on or not self.view.demand(p).gpus)]
        if deletable:
            pod = self.rng.choice(deletable)
            del self.pods[pod["metadata"]["name"]]
            self.view.on_change("Pod", pod, None)

    def assume(self) -> None:
        """The extender holds GPUs for a pod it is binding (prioritize's pick, not yet seen bound)."""
        state, policy = self.view.snapshot()
        demand = self.view.demand(pending(self.pod_name(), gpus=self.rng.choice((1, 2)), cpu="1"))
        # (Not where a pod the model could not account over-committed a GPU: ClusterState.place refuses any pod
        # there, and so does assume.)
        rows = np.flatnonzero(feasible(state, demand) & (state.gpu_left >= 0).all(axis=1))
        if rows.size:
            row = int(self.rng.choice(rows.tolist()))
            self.view.assume(f"ml/assumed-{self.serial}", state.names[row], demand,
                             policy.devices(state, demand, row))

    def node_event(self) -> None:
        absent = [n for n in self.all if n not in self.present]
        kind = self.rng.choice(("add", "remove", "relabel", "respec", "heartbeat"))
        if kind == "remove" and len(self.present) <= len(self.all) // 2:
            kind = "add"  # keep a cluster to compare
        if kind == "add" and absent:
            name = self.rng.choice(absent)
            self.node(name, self.all[name])
        elif not self.present:
            return
        elif kind == "remove":
            self.node(self.rng.choice(list(self.present)), None)
        elif kind == "relabel":  # the pool label: part of the NodeSpec (node group)
            name = self.rng.choice(list(self.present))
            obj = copy.deepcopy(self.present[name])
            obj["metadata"]["labels"]["gpuaas.io/pool"] = f"moved-{self.serial}"
            self.serial += 1
            self.node(name, obj)
        elif kind == "respec":  # another pool's node under this name: GPUs, capacity, MIG layout, replicas change
            name = self.rng.choice(list(self.present))
            self.node(name, renamed(self.all[self.rng.choice(list(self.all))], name))
        else:
            name = self.rng.choice(list(self.present))
            obj = copy.deepcopy(self.present[name])
            obj["metadata"]["labels"]["example.com/beat"] = str(self.serial)
            self.serial += 1
            self.node(name, obj)


def started(workload: Workload | None, seed: int) -> Events:
    view = ClusterView("gpuaas", assume_ttl=1e9, clock=Clock(), workload=workload)
    events = Events(view, seed)
    rng = random.Random(seed)
    for name, obj in events.all.items():
        if name.endswith("0000") or rng.random() < 0.6:  # every GPU model present at first
            events.node(name, obj)
    view.snapshot()
    for _ in range(30):
        events.gpu_pod_with_devices()
    return events


@pytest.mark.parametrize("workload", [RESTRICTED, PLAIN], ids=["model-restricted-shapes", "plain"])
@pytest.mark.parametrize("seed", range(4))
def test_random_node_and_pod_events_leave_the_model_a_rebuild_would_make(workload, seed):
    events = started(workload, seed)
    steps = [events.node_event] * 6 + [events.gpu_pod_with_devices] * 4 + [events.foreign_gpu_pod, events.cpu_pod,
                                                                           events.delete_pod, events.assume]
    for i in range(90):
        events.rng.choice(steps)()
        if i % 3 == 2:
            check_against_rebuild(events.view)
    check_against_rebuild(events.view)
    # The sequences change the node set dozens of times: most of them in place (a GPU model's last node leaving,
    # or a node of a model the model lacks, still rebuilds).
    assert events.view.rebuilds <= 20


def test_a_node_added_removed_relabelled_and_respecced_in_place_equals_a_rebuild():
    """Each kind of node change, with pods bound before the node arrives, assumed GPUs on a node read anew, and a
    model-restricted workload: no rebuild, the same model as one."""
    events = started(RESTRICTED, 99)
    view = events.view
    absent = "h100-0002"
    for pod in [p for p in events.pods.values() if p["spec"]["nodeName"] == absent]:  # its pods gone, then itself
        del events.pods[pod["metadata"]["name"]]
        view.on_change("Pod", pod, None)
    if absent in events.present:
        events.node(absent, None)
        check_against_rebuild(view)
    events.bind(pending("early", gpus=2, cpu="2"), absent, "1,2")  # bound before its node is seen
    events.bind(pending("early-cpu", cpu="4"), absent)
    events.node(absent, events.all[absent])
    check_against_rebuild(view)
    assert view.placements["ml/early"].devices == (1, 2)
    events.assume()
    held = next(p.node for k, p in view.placements.items() if k in view.assumed)
    relabelled = copy.deepcopy(events.present[held])
    relabelled["metadata"]["labels"]["gpuaas.io/pool"] = "moved"
    events.node(held, relabelled)
    check_against_rebuild(view)
    assert view.state is not None and view.state.nodes[view.state.index[held]].node_group == "moved"
    mig = next(n for n in events.present if n.startswith("mig"))
    a100 = next(n for n in events.all if n.startswith("a100"))
    events.node(mig, renamed(events.all[a100], mig))  # the same GPU model without MIG: the row made anew
    check_against_rebuild(view)
    events.node(absent, None)
    check_against_rebuild(view)
    assert "ml/early" not in view.placements and "ml/early" in view.pods  # bound to a node the model lacks
    assert view.rebuilds == 1


def test_a_node_of_a_gpu_model_the_model_lacks_or_loses_rebuilds():
    view = ClusterView("gpuaas", clock=Clock(), workload=PLAIN)
    nodes = universe()
    for name, obj in nodes.items():
        if not name.startswith("l40s"):
            view.on_change("Node", None, obj)
    view.snapshot()
    view.on_change("Node", None, nodes["l40s-0000"])  # L40S: a model column the model does not have
    view.snapshot()
    assert view.rebuilds == 2
    view.on_change("Node", None, nodes["l40s-0001"])
    view.snapshot()
    assert view.rebuilds == 2
    view.on_change("Node", nodes["l40s-0001"], None)
    view.on_change("Node", nodes["l40s-0000"], None)  # the last L40S: its column goes
    view.snapshot()
    assert view.rebuilds == 3


def test_every_state_array_is_a_row_array_and_rows_move_with_their_nodes():
    specs = sorted((node_spec(n) for n in universe().values()), key=lambda s: s.name)
    full = ClusterState(specs)
    arrays = {k for k, v in vars(full).items() if isinstance(v, np.ndarray)}
    assert arrays == set(ClusterState.ROW_ARRAYS)
    pods = [(PodDemand(cpu_milli=1000, gpus=1, gpu_milli=MILLI), "a100-0001", (3,)),
            (PodDemand(gpus=1, mig_profile="2g.20gb"), "mig-0001", (5,)),
            (PodDemand(gpus=2, gpu_milli=MILLI), "l40s-0000", (0, 0))]
    for demand, name, devices in pods:
        full.place(full.index[name], demand, devices)
    for gone in ("a100-0000", "h100-0001", "mig-0000"):  # first, middle, MIG rows
        part = ClusterState([s for s in specs if s.name != gone])
        for demand, name, devices in pods:
            part.place(part.index[name], demand, devices)
        row = full.index[gone]
        part.insert_node(row, specs[row])
        assert_same_state(part, full)
        part.delete_node(row)
        part.insert_node(row, specs[row])
        assert_same_state(part, full)
    with pytest.raises(ValueError, match="already"):
        full.insert_node(0, specs[0])


def test_a_changed_names_list_is_a_new_list():
    """The prioritize encoder keys its records on the names list: a row in or out must give a new one."""
    specs = sorted((node_spec(n) for n in universe().values()), key=lambda s: s.name)
    state = ClusterState(specs[1:])
    before = state.names
    state.insert_node(0, specs[0])
    assert state.names is not before and before == [s.name for s in specs[1:]]
