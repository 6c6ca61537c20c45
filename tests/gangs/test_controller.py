"""The gang controller's reconcile on a recording PodWriter: the commands a decision turns into, in order."""
from gangs.controller import GangController, read_members
from scoring.gangs import GANG_GATE, KUEUE_GATE, RELEASED_ANNOTATION, GangSettings, NodeFacts
from scoring.model import ClusterState, NodeSpec

SETTINGS = GangSettings(policy="bestfit", time_limit_s=2.0, bind_timeout_s=60.0, reserve_after_s=300.0)


class RecordingPods:
    """The PodWriter contract as data: what was asked, in order; `refuse` pods whose writes fail."""

    def __init__(self, refuse=()):
        self.calls = []
        self.refuse = set(refuse)

    def pin(self, key, uid, hostname, released_at, planned=""):
        self.calls.append(("pin", key, hostname, planned))
        return key not in self.refuse

    def ungate(self, key, uid):
        self.calls.append(("ungate", key))
        return key not in self.refuse

    def delete(self, key, uid):
        self.calls.append(("delete", key))
        return True

    def note(self, key, uid, type_, reason, message):
        self.calls.append(("note", key, reason, message))


def pod(name, *, gpus=8, size=2, gates=(GANG_GATE,), node=None, owner=True, released=None, group="g"):
    ann = {"gpuaas.io/gang-size": str(size)}
    if released is not None:
        ann[RELEASED_ANNOTATION] = str(released)
    meta = {"name": name, "namespace": "ml", "uid": f"u-{name}", "labels": {"gpuaas.io/gang": group},
            "annotations": ann, "creationTimestamp": "2026-11-24T00:00:00Z"}
    if owner:
        meta["ownerReferences"] = [{"kind": "Job", "name": "j", "uid": "j", "controller": True}]
    spec = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
            "schedulingGates": [{"name": g} for g in gates]}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": "Running" if node else "Pending"}}


def cluster(n=2):
    state = ClusterState([NodeSpec(f"n{i}", 96_000, 512_000, 8, "A100-80GB") for i in range(n)])
    return state, [NodeFacts(f"n{i}", {"kubernetes.io/hostname": f"h{i}"}, (), False) for i in range(n)]


def test_a_release_pins_every_member_before_removing_any_gate():
    pods = RecordingPods()
    state, facts = cluster()
    report = GangController(SETTINGS, pods).reconcile(state, facts, [pod("a"), pod("b")], now=100.0)
    assert report.released == ["ml/g"]
    verbs = [c[0] for c in pods.calls if c[0] != "note"]
    assert verbs == ["pin", "pin", "ungate", "ungate"]
    assert {c[2] for c in pods.calls if c[0] == "pin"} == {"h0", "h1"}  # pinned by the node's hostname label


def test_a_failed_pin_keeps_the_whole_gang_gated():
    pods = RecordingPods(refuse={"ml/b"})
    state, facts = cluster()
    report = GangController(SETTINGS, pods).reconcile(state, facts, [pod("a"), pod("b")], now=100.0)
    assert report.released == [] and report.failed_writes == 1
    assert not [c for c in pods.calls if c[0] == "ungate"]


def test_a_waiting_gang_is_told_once_per_reason():
    pods = RecordingPods()
    state, facts = cluster(n=1)
    controller = GangController(SETTINGS, pods)
    for now in (1.0, 2.0, 3.0):
        report = controller.reconcile(state, facts, [pod("a"), pod("b")], now=now)
    assert list(report.waiting) == ["ml/g"]
    notes = [c for c in pods.calls if c[0] == "note"]
    assert len(notes) == 2 and all(c[2] == "GangWaiting" and "do not fit together" in c[3] for c in notes)
    assert controller.explain("ml/a")["action"] == "wait"


def test_kueue_keeps_its_gate_and_the_gang_waits_for_it():
    pods = RecordingPods()
    state, facts = cluster()
    members = [pod("a", gates=(GANG_GATE, KUEUE_GATE)), pod("b", gates=(KUEUE_GATE, GANG_GATE))]
    report = GangController(SETTINGS, pods).reconcile(state, facts, members, now=1.0)
    assert "kueue.x-k8s.io/admission" in report.waiting["ml/g"]
    assert not [c for c in pods.calls if c[0] in ("pin", "ungate", "delete")]


def test_a_stuck_half_placed_gang_is_deleted_for_its_owner_to_create_again():
    pods = RecordingPods()
    state, facts = cluster()
    members = [pod("a", gates=(), node="n0", released=0.0), pod("b", gates=(), released=0.0, owner=False)]
    report = GangController(SETTINGS, pods).reconcile(state, facts, members, now=100.0)
    assert report.reset == ["ml/g"]
    assert [c for c in pods.calls if c[0] == "delete"] == [("delete", "ml/a")]
    warned = [c for c in pods.calls if c[0] == "note" and c[1] == "ml/b"]
    assert warned and "no controller to create it again" in warned[0][3]


def test_unreadable_groups_are_reported_not_planned():
    bad = pod("x")
    bad["metadata"]["annotations"]["gpuaas.io/gang-size"] = "lots"
    members = read_members([bad, pod("a"), {**pod("done"), "status": {"phase": "Succeeded"}}])
    assert "whole number" in members.unreadable["ml/x"]
    assert [m.key for m in members.gangs["ml/g"].members] == ["ml/a"]
    controller = GangController(SETTINGS, RecordingPods())
    controller.reconcile(*cluster(), [bad], now=1.0)
    assert "whole number" in controller.explain("ml/x")["error"]
    assert controller.explain("ml/other")["gang"] is None


def test_a_release_carries_each_members_planned_gpus_to_the_extender():
    pods = RecordingPods()
    state, facts = cluster(n=1)
    GangController(SETTINGS, pods).reconcile(state, facts, [pod("a", gpus=4), pod("b", gpus=4)], now=1.0)
    planned = sorted(c[3] for c in pods.calls if c[0] == "pin")
    assert planned == ["n0:0,1,2,3", "n0:4,5,6,7"]  # node name, then the GPUs: the two members do not overlap


def test_a_stuck_gang_no_one_can_create_again_waits_on_its_pins_and_is_not_reset_over_and_over():
    pods = RecordingPods()
    state, facts = cluster()
    members = [pod("a", gates=(), node="n0", released=0.0, owner=False),
               pod("b", gates=(), released=0.0, owner=False)]
    controller = GangController(SETTINGS, pods)
    for now in (100.0, 101.0, 102.0):
        report = controller.reconcile(state, facts, members, now=now)
    assert report.reset == [] and "no member has a controller" in report.waiting["ml/g"]
    assert not [c for c in pods.calls if c[0] == "delete"]
    assert [c[1] for c in pods.calls if c[0] == "note"] == ["ml/b"]  # told once, on the member left unbound


def test_a_write_that_times_out_is_a_failed_write_not_the_end_of_the_round():
    """On a loaded apiserver a pin or gate removal can time out (urllib3's ReadTimeoutError, not an ApiException): it
    counts as a failed write and the round goes on (a 200-node DRA replay lost a round of releases to one)."""
    from kubernetes import client
    from urllib3.exceptions import ReadTimeoutError

    from gangs.controller import KubePods
    from gangs.dra import KubeClaims

    def timeout(*_args, **_kwargs):
        raise ReadTimeoutError(None, "/api/v1/namespaces/ml/pods/p", "Read timed out. (read timeout=4)")

    pods = KubePods(client.ApiClient())
    pods.core.patch_namespaced_pod = timeout
    pods.core.read_namespaced_pod = timeout
    assert pods.pin("ml/p", "u", "node-1", 1.0) is False
    assert pods.ungate("ml/p", "u") is False
    claims = KubeClaims(client.ApiClient())
    claims.resource.read_namespaced_resource_claim = timeout
    assert claims.allocate("ml/c", "u", {"devices": {"results": []}}, "pod-uid") is False
