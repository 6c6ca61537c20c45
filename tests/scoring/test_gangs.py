"""Gangs: group labels read as users write them, and the all-or-nothing decisions, each case worked out by hand."""
import pytest

from scoring.gangs import (
    GANG_GATE,
    KUEUE_GATE,
    RELEASED_ANNOTATION,
    GangSettings,
    GroupError,
    NodeFacts,
    decide,
    group_of,
    member,
)
from scoring.gangs import Gang as GangRecord
from scoring.model import ClusterState, NodeSpec

FAST = GangSettings(policy="bestfit", time_limit_s=2.0, bind_timeout_s=60.0, reserve_after_s=100.0)


def pod(name, gpus=8, *, group=("gpuaas.io/gang", "g"), size=4, gates=(GANG_GATE,), node=None, selector=None,
        created=0.0, released=None, priority=0, annotations=None, tolerations=None):
    labels = {group[0]: group[1]} if group else {}
    ann = dict(annotations or {})
    if group and "gang-size" not in str(ann) and "total-count" not in str(ann):
        ann["kueue.x-k8s.io/pod-group-total-count" if group[0].startswith("kueue") else "gpuaas.io/gang-size"] = \
            str(size)
    if released is not None:
        ann[RELEASED_ANNOTATION] = str(released)
    spec = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "4", "memory": "8Gi"},
                                                       "limits": {"nvidia.com/gpu": str(gpus)}}}],
            "schedulingGates": [{"name": g} for g in gates], "priority": priority}
    if node:
        spec["nodeName"] = node
    if selector:
        spec["nodeSelector"] = selector
    if tolerations:
        spec["tolerations"] = tolerations
    obj = {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "labels": labels, "annotations": ann},
           "spec": spec}
    return member(obj, created)


def cluster(n=4, gpus=8):
    state = ClusterState([NodeSpec(f"n{i}", 96_000, 512_000, gpus, "A100-80GB") for i in range(n)])
    facts = [NodeFacts(f"n{i}", {"kubernetes.io/hostname": f"n{i}"}, (), False) for i in range(n)]
    return state, facts


def gang(members, size=None):
    ref = group_of({"metadata": {"namespace": "ml", "labels": {"gpuaas.io/gang": "g"},
                                 "annotations": {"gpuaas.io/gang-size": str(size or len(members))}}})
    return GangRecord(ref, list(members))


def test_group_labels_users_already_write():
    kueue = {"metadata": {"namespace": "a", "labels": {"kueue.x-k8s.io/pod-group-name": "train"},
                          "annotations": {"kueue.x-k8s.io/pod-group-total-count": "4"}}}
    ref = group_of(kueue)
    assert (ref.source, ref.name, ref.size, ref.min_count, ref.key) == ("kueue", "train", 4, 4, "a/kueue:train")
    cosched = {"metadata": {"labels": {"scheduling.x-k8s.io/pod-group": "pg"},
                            "annotations": {"gpuaas.io/gang-size": "3", "gpuaas.io/gang-min-count": "2"}}}
    ref = group_of(cosched)
    assert (ref.namespace, ref.source, ref.size, ref.min_count) == ("default", "coscheduling", 3, 2)
    assert group_of({"metadata": {"labels": {"app": "x"}}}) is None


@pytest.mark.parametrize("labels, annotations, words", [
    ({"gpuaas.io/gang": "g"}, {}, "needs annotation gpuaas.io/gang-size"),
    ({"gpuaas.io/gang": "g"}, {"gpuaas.io/gang-size": "four"}, "whole number, not 'four'"),
    ({"gpuaas.io/gang": "g"}, {"gpuaas.io/gang-size": "0"}, "between 1 and"),
    ({"gpuaas.io/gang": "g"}, {"gpuaas.io/gang-size": "2", "gpuaas.io/gang-min-count": "3"}, "more than the group"),
    ({"gpuaas.io/gang": ""}, {"gpuaas.io/gang-size": "2"}, "label gpuaas.io/gang is empty"),
    ({"kueue.x-k8s.io/pod-group-name": "t"}, {}, "kueue.x-k8s.io/pod-group-total-count"),
])
def test_bad_group_labels_name_what_is_wrong(labels, annotations, words):
    with pytest.raises(GroupError, match=words):
        group_of({"metadata": {"labels": labels, "annotations": annotations}})


def test_a_complete_gang_is_released_pinned_to_distinct_nodes():
    state, facts = cluster()
    members = [pod(f"w{i}") for i in range(4)]
    [d] = decide(state, facts, [gang(members)], now=10.0, settings=FAST)
    assert d.action == "release"
    assert sorted(h for _, h in d.pins) == ["n0", "n1", "n2", "n3"]  # 4 x 8 GPUs on four 8-GPU nodes


def test_an_incomplete_gang_waits_for_its_members():
    state, facts = cluster()
    [d] = decide(state, facts, [gang([pod("w0"), pod("w1")], size=4)], now=10.0, settings=FAST)
    assert d.action == "wait" and "2 of 4 created" in d.message


def test_a_gang_that_cannot_fit_waits_whole_with_its_reason():
    state, facts = cluster(n=3)
    [d] = decide(state, facts, [gang([pod(f"w{i}") for i in range(4)])], now=10.0, settings=FAST)
    assert d.action == "wait" and d.pins == () and "4 pods do not fit together" in d.message


def test_two_gangs_needing_most_of_the_cluster_never_half_place():
    # Each gang needs 3 of the 4 nodes: the first (by arrival) is released whole, the second waits whole.
    state, facts = cluster()
    a = gang([pod(f"a{i}", size=3, created=1.0) for i in range(3)])
    b_ref = group_of({"metadata": {"namespace": "ml", "labels": {"gpuaas.io/gang": "b"},
                                   "annotations": {"gpuaas.io/gang-size": "3"}}})
    b = GangRecord(b_ref, [pod(f"b{i}", group=("gpuaas.io/gang", "b"), size=3, created=2.0) for i in range(3)])
    da, db = decide(state, facts, [b, a], now=10.0, settings=FAST)
    assert (da.gang, da.action) == ("ml/g", "release") and len(da.pins) == 3
    assert (db.gang, db.action) == ("ml/b", "wait")


def test_released_members_not_bound_yet_hold_their_nodes():
    state, facts = cluster(n=2)
    first = gang([pod("a0", gates=(), selector={"kubernetes.io/hostname": "n0"}, released=5.0)], size=1)
    b_ref = group_of({"metadata": {"namespace": "ml", "labels": {"gpuaas.io/gang": "b"},
                                   "annotations": {"gpuaas.io/gang-size": "1"}}})
    second = GangRecord(b_ref, [pod("b0", group=("gpuaas.io/gang", "b"), size=1)])
    decisions = {d.gang: d for d in decide(state, facts, [first, second], now=10.0, settings=FAST)}
    assert "ml/g" not in decisions  # released, within its bound, not all bound: nothing to do
    assert decisions["ml/b"].pins == (("ml/b0", "n1"),)  # n0 is held for a0


def test_members_released_but_not_bound_in_time_reset_the_gang():
    state, facts = cluster()
    members = [pod("w0", gates=(), node="n0", released=0.0),
               pod("w1", gates=(), selector={"kubernetes.io/hostname": "n1"}, released=0.0)]
    [d] = decide(state, facts, [gang(members)], now=61.0, settings=FAST)
    assert d.action == "reset" and "1 of 2 members" in d.message and set(d.members) == {"ml/w0", "ml/w1"}
    assert decide(state, facts, [gang(members)], now=59.0, settings=FAST) == []  # within the bound: wait for binds


def test_another_components_gate_is_waited_for():
    state, facts = cluster()
    members = [pod(f"w{i}", gates=(GANG_GATE, KUEUE_GATE)) for i in range(4)]
    [d] = decide(state, facts, [gang(members)], now=10.0, settings=FAST)
    assert d.action == "wait" and KUEUE_GATE in d.message


def test_node_selectors_taints_and_cordons_are_honoured():
    state, facts = cluster()
    facts[0] = NodeFacts("n0", {"kubernetes.io/hostname": "n0"}, (("dedicated", "x", "NoSchedule"),), False)
    facts[1] = NodeFacts("n1", {"kubernetes.io/hostname": "n1"}, (), True)  # cordoned
    facts[2] = NodeFacts("n2", {"kubernetes.io/hostname": "n2", "zone": "b"}, (), False)
    facts[3] = NodeFacts("n3", {"kubernetes.io/hostname": "n3", "zone": "a"}, (), False)
    members = [pod("w0", gpus=4, selector={"zone": "a"}), pod("w1", gpus=4, selector={"zone": "a"})]
    [d] = decide(state, facts, [gang(members)], now=10.0, settings=FAST)
    assert d.action == "release" and {h for _, h in d.pins} == {"n3"}
    tolerant = [pod("w0", tolerations=[{"key": "dedicated", "operator": "Exists"}]), pod("w1")]
    [d] = decide(state, facts, [gang(tolerant)], now=10.0, settings=FAST)
    assert d.action == "release" and dict(d.pins)["ml/w1"] != "n0" and "n1" not in dict(d.pins).values()


def test_a_long_waiting_gang_stops_later_gangs_from_backfilling():
    state, facts = cluster(n=2)
    big = gang([pod(f"a{i}", created=0.0) for i in range(3)])  # 3 x 8 GPUs on 2 nodes: never fits
    b_ref = group_of({"metadata": {"namespace": "ml", "labels": {"gpuaas.io/gang": "b"},
                                   "annotations": {"gpuaas.io/gang-size": "1"}}})
    small = GangRecord(b_ref, [pod("b0", group=("gpuaas.io/gang", "b"), size=1, created=5.0)])
    early = {d.gang: d.action for d in decide(state, facts, [big, small], now=50.0, settings=FAST)}
    assert early == {"ml/g": "wait", "ml/b": "release"}  # backfill while the big gang is young
    late = {d.gang: d for d in decide(state, facts, [big, small], now=150.0, settings=FAST)}
    assert late["ml/b"].action == "wait" and "held behind gang ml/g" in late["ml/b"].message


def test_priority_goes_before_arrival():
    state, facts = cluster(n=1)
    low = gang([pod("a0", created=0.0)], size=1)
    b_ref = group_of({"metadata": {"namespace": "ml", "labels": {"gpuaas.io/gang": "b"},
                                   "annotations": {"gpuaas.io/gang-size": "1"}}})
    high = GangRecord(b_ref, [pod("b0", group=("gpuaas.io/gang", "b"), size=1, created=5.0, priority=100)])
    actions = {d.gang: d.action for d in decide(state, facts, [low, high], now=10.0, settings=FAST)}
    assert actions == {"ml/b": "release", "ml/g": "wait"}


def test_nodes_without_a_hostname_label_are_not_planned_on():
    state, facts = cluster(n=2)
    facts[0] = NodeFacts("n0", {}, (), False)
    [d] = decide(state, facts, [gang([pod("w0")], size=1)], now=1.0, settings=FAST)
    assert d.pins == (("ml/w0", "n1"),)


def test_a_release_that_did_not_finish_is_completed_on_its_pins_or_reset():
    state, facts = cluster()
    members = [pod("w0", selector={"kubernetes.io/hostname": "n2"}, released=0.0), pod("w1")]
    [d] = decide(state, facts, [gang(members)], now=10.0, settings=FAST)
    assert d.action == "release" and dict(d.pins)["ml/w0"] == "n2"  # the pin made before the crash holds
    [d] = decide(state, facts, [gang(members)], now=61.0, settings=FAST)
    assert d.action == "reset" and "never released" in d.message


def test_a_pod_alone_is_placed_as_the_simulator_places_one():
    """A gang of one (every DRA pod gpuaas allocates) goes where the place-one-pod loop puts it, node and GPU: a 300
    share goes beside the 650 share (650+300 packs a GPU) rather than on the idle GPU or beside the 230, as the gpuaas
    policy's cutting-stock regret says and CP-SAT's 0..100 preference did not always."""
    from scoring.fragmentation import Workload
    from scoring.gangs import place_alone
    from scoring.model import PodDemand
    from scoring.placement import Placer
    from scoring.policies import make_policy

    state = ClusterState([NodeSpec("a", 64000, 262144, 4, "A100-80GB")])
    state.place(0, PodDemand(cpu_milli=1000, memory_mib=1024, gpus=1, gpu_milli=650), (0,))
    state.place(0, PodDemand(cpu_milli=1000, memory_mib=1024, gpus=1, gpu_milli=230), (1,))
    pods = [PodDemand(cpu_milli=1000, memory_mib=1024, gpus=1, gpu_milli=m) for m in (650, 300, 230, 1000)]
    workload = Workload.typical(pods)
    share = PodDemand(cpu_milli=1000, memory_mib=1024, gpus=1, gpu_milli=300, name="ml/s")
    plan = place_alone(state, share, "gpuaas", workload, None)
    expected = Placer(state, make_policy("gpuaas", state, workload)).choose(share)
    assert plan.ok and expected is not None and plan.placements == [(expected.node, expected.devices)]
    assert plan.placements == [(0, (0,))]
    big = PodDemand(cpu_milli=1000, memory_mib=1024, gpus=4, gpu_milli=1000, name="ml/big")
    refused = place_alone(state, big, "gpuaas", workload, None)
    assert not refused.ok and refused.notes == ["pod ml/big fits on no node it may go to, even alone"]
