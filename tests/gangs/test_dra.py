"""The gang controller allocating DRA claims (gangs.dra): what it writes, in which order, and what it clears."""
from __future__ import annotations

import copy
import threading

import pytest

from gangs.controller import GangController
from gangs.dra import DraInputs, rfc3339
from runtime.draslices import resource_slices
from runtime.pools import node_objects, parse_pool_spec
from scoring.clusterview import ClusterView
from scoring.dra import MIG_CLASS, SHARE_CLASS
from scoring.draclaims import ALLOCATED_FOR_ANNOTATION, DeviceResult, allocation
from scoring.fragmentation import Workload
from scoring.gangs import GANG_GATE, GangSettings, NodeFacts
from scoring.kubeobjects import node_spec
from scoring.model import ClusterState, PodDemand

SETTINGS = GangSettings(policy="gpuaas", time_limit_s=2.0, bind_timeout_s=60.0, reserve_after_s=300.0)
NOW = 1_800_000_000.0
WORKLOAD = Workload.typical([PodDemand(4000, 16384, gpus=1, gpu_milli=1000),
                             PodDemand(4000, 16384, gpus=2, gpu_milli=1000),
                             PodDemand(4000, 16384, gpus=1, gpu_milli=250)])
POOLS = {"pools": [
    {"name": "dra", "count": 2, "dra": True, "cpu": "64", "memory": "512Gi",
     "gpu": {"model": "A100-80GB", "count": 4, "topology": {"numaNode": 2}}},
    {"name": "mig", "count": 1, "dra": True, "cpu": "64", "memory": "512Gi",
     "gpu": {"model": "A100-80GB", "count": 2, "mig": "all-balanced"}},
]}


class RecordingPods:
    def __init__(self):
        self.calls = []

    def pin(self, key, uid, hostname, released_at, planned=""):
        self.calls.append(("pin", key, hostname))
        return True

    def ungate(self, key, uid):
        self.calls.append(("ungate", key))
        return True

    def delete(self, key, uid):
        self.calls.append(("delete", key))
        return True

    def note(self, key, uid, type_, reason, message):
        self.calls.append(("note", key, reason, message))


class RecordingClaims:
    """The ClaimWriter contract as data; `refuse`: claims whose allocation fails."""

    def __init__(self, refuse=()):
        self.calls = []
        self.refuse = set(refuse)

    def allocate(self, key, uid, allocation_, pod_uid):
        self.calls.append(("allocate", key, copy.deepcopy(dict(allocation_)), pod_uid))
        return key not in self.refuse

    def deallocate(self, key, uid):
        self.calls.append(("deallocate", key))
        return True


def cluster():
    spec = parse_pool_spec(POOLS)
    nodes, slices = {}, []
    for pool in spec.pools:
        for n in node_objects(pool):
            nodes[n["metadata"]["name"]] = n
            slices += resource_slices(pool, n["metadata"]["name"])
    state = ClusterState(sorted((node_spec(n) for n in nodes.values()), key=lambda s: s.name))
    facts = [NodeFacts.of(nodes[name]) for name in state.names]
    return state, facts, nodes, slices


def claim(name, cls="gpu.nvidia.com", *, count=1, selector="", share=None, alloc=None, by=None, reserved=(),
          constraints=None):
    exactly = {"deviceClassName": cls}
    if count != 1:
        exactly["count"] = count
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    if share:
        exactly["capacity"] = {"requests": {"share": share}}
    meta = {"name": name, "namespace": "ml", "uid": f"c-{name}"}
    if by:
        meta["annotations"] = {ALLOCATED_FOR_ANNOTATION: by}
    devices = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if constraints:
        devices["constraints"] = constraints
    status = {}
    if alloc is not None:
        status["allocation"] = alloc
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": r, "uid": r} for r in reserved]
    return {"metadata": meta, "spec": {"devices": devices}, "status": status}


def pod(name, *claims, gated=True, group=None, size=1):
    meta = {"name": name, "namespace": "ml", "uid": f"u-{name}", "creationTimestamp": "2026-11-24T00:00:00Z",
            "ownerReferences": [{"kind": "Job", "name": "j", "uid": "j", "controller": True}]}
    if group:
        meta["labels"] = {"gpuaas.io/gang": group}
        meta["annotations"] = {"gpuaas.io/gang-size": str(size)}
    spec = {"containers": [{"name": "c", "resources": {"requests": {"cpu": "4", "memory": "16Gi"}}}],
            "resourceClaims": [{"name": f"e{i}", "resourceClaimName": c} for i, c in enumerate(claims)]}
    if gated:
        spec["schedulingGates"] = [{"name": GANG_GATE}]
    return {"metadata": meta, "spec": spec, "status": {"phase": "Pending"}}


def run(controller, pods, claims, now=NOW, live=None, parsed=False):
    """One round; `parsed`: with the slices and claims as the service's live view read them (DraView.parsed)."""
    state, facts, nodes, slices = cluster()
    uids = frozenset(live if live is not None else (p["metadata"]["uid"] for p in pods))
    read = None
    if parsed:
        view = ClusterView("gpuaas")
        for kind, objs in (("ResourceSlice", slices), ("ResourceClaim", claims)):
            for obj in objs:
                view.on_change(kind, None, obj)
        read = view.dra.parsed()
    return controller.reconcile(state, facts, pods, now, WORKLOAD, dra=DraInputs(slices, claims, nodes, uids, read))


def allocations_(claims_writer):
    return {c[1]: c[2] for c in claims_writer.calls if c[0] == "allocate"}


def devices(alloc):
    return [(r["pool"], r["device"]) for r in alloc["devices"]["results"]]


def test_a_gated_pod_s_claim_is_allocated_then_the_pod_pinned_and_released():
    pods, claims = RecordingPods(), RecordingClaims()
    report = run(GangController(SETTINGS, pods, claims=claims), [pod("p", "c")], [claim("c")])
    assert report.released == ["ml/pod:p"] and report.allocated == 1
    [(verb, key, alloc, pod_uid)] = claims.calls
    [(node, device)] = devices(alloc)
    assert (verb, key, pod_uid, alloc["allocationTimestamp"]) == ("allocate", "ml/c", "u-p", rfc3339(NOW))
    assert alloc["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [node]
    assert device.startswith("gpu-") and not device.endswith("-shared")
    assert [c[:3] for c in pods.calls if c[0] != "note"] == [("pin", "ml/p", node), ("ungate", "ml/p")]


@pytest.mark.parametrize("parsed", [False, True], ids=["claims-read-in-the-round", "claims-read-by-the-view"])
def test_its_own_writes_count_before_the_informer_shows_them(parsed):
    """The next round sees the claims as the informer still shows them (unallocated): the assumed allocation holds
    the device, so the next pod gets another one and the first is not allocated twice."""
    pods, claims = RecordingPods(), RecordingClaims()
    controller = GangController(SETTINGS, pods, claims=claims)
    run(controller, [pod("p", "a")], [claim("a")], parsed=parsed)
    run(controller, [pod("p", "a"), pod("q", "b")], [claim("a"), claim("b")], now=NOW + 1, parsed=parsed)
    got = allocations_(claims)
    assert [c[1] for c in claims.calls] == ["ml/a", "ml/b"]
    assert devices(got["ml/a"]) != devices(got["ml/b"])


@pytest.mark.parametrize("parsed", [False, True], ids=["claims-read-in-the-round", "claims-read-by-the-view"])
def test_a_restart_rebuilds_usage_from_the_claims(parsed):
    """A new controller (no assumptions) reads the allocation from the claim: the device stays taken, the gated pod
    whose claim is allocated is pinned to that node without a new allocation."""
    first = RecordingClaims()
    run(GangController(SETTINGS, RecordingPods(), claims=first), [pod("p", "a")], [claim("a")])
    alloc = allocations_(first)["ml/a"]
    pods, claims = RecordingPods(), RecordingClaims()
    held = claim("a", alloc=alloc, by="u-p")
    run(GangController(SETTINGS, pods, claims=claims), [pod("p", "a"), pod("q", "b")], [held, claim("b")],
        parsed=parsed)
    assert [c[1] for c in claims.calls] == ["ml/b"]
    assert devices(allocations_(claims)["ml/b"]) != devices(alloc)
    node = devices(alloc)[0][0]
    assert ("pin", "ml/p", node) in pods.calls


def test_a_gang_allocates_every_member_before_any_pin_and_gives_back_on_failure():
    pods, claims = RecordingPods(), RecordingClaims(refuse={"ml/b"})
    members = [pod("p", "a", group="g", size=2), pod("q", "b", group="g", size=2)]
    report = run(GangController(SETTINGS, pods, claims=claims), members, [claim("a", count=4), claim("b", count=4)])
    assert report.released == [] and report.failed_writes == 1
    assert [c[:2] for c in claims.calls] == [("allocate", "ml/a"), ("allocate", "ml/b"), ("deallocate", "ml/a")]
    assert not [c for c in pods.calls if c[0] in ("pin", "ungate")]
    ok = RecordingClaims()
    pods = RecordingPods()
    report = run(GangController(SETTINGS, pods, claims=ok), members, [claim("a", count=4), claim("b", count=4)])
    assert report.released == ["ml/g"]
    verbs = [c[0] for c in ok.calls] + [c[0] for c in pods.calls if c[0] != "note"]
    assert verbs == ["allocate", "allocate", "pin", "pin", "ungate", "ungate"]
    nodes = {devices(a)[0][0] for a in allocations_(ok).values()}
    assert nodes == {"dra-0000", "dra-0001"}  # 4 GPUs each: one node per member


class MeetingClaims(RecordingClaims):
    """Each allocation waits (up to 5 s) until `together` allocations are under way at once, and fails if they never
    are: written one after another, the claims of different gangs would all fail."""

    def __init__(self, together, refuse=()):
        super().__init__(refuse)
        self.barrier = threading.Barrier(together, timeout=5)

    def allocate(self, key, uid, allocation_, pod_uid):
        try:
            self.barrier.wait()
        except threading.BrokenBarrierError:
            return False
        return super().allocate(key, uid, allocation_, pod_uid)


def test_the_claims_of_different_gangs_are_written_at_once():
    pods, claims = RecordingPods(), MeetingClaims(3)
    report = run(GangController(SETTINGS, pods, claims=claims), [pod("p", "a"), pod("q", "b"), pod("r", "c")],
                 [claim("a"), claim("b"), claim("c")])
    assert report.allocated == 3 and report.failed_writes == 0
    assert sorted(report.released) == ["ml/pod:p", "ml/pod:q", "ml/pod:r"]


def test_a_gang_that_fails_gives_back_its_claims_while_others_are_released():
    pods, claims = RecordingPods(), RecordingClaims(refuse={"ml/b"})
    members = [pod("p", "a", group="g", size=2), pod("q", "b", group="g", size=2)]
    report = run(GangController(SETTINGS, pods, claims=claims), [*members, pod("r", "c")],
                 [claim("a"), claim("b"), claim("c")])
    assert report.released == ["ml/pod:r"] and report.allocated == 1 and report.failed_writes == 1
    assert ("deallocate", "ml/a") in claims.calls and ("deallocate", "ml/c") not in claims.calls
    assert {c[1] for c in pods.calls if c[0] in ("pin", "ungate")} == {"ml/r"}


def test_mig_share_and_pcie_root_claims():
    pods, claims = RecordingPods(), RecordingClaims()
    root = [{"matchAttribute": "resource.kubernetes.io/pcieRoot"}]
    held = claim("held", alloc=allocation("dra-0000", [DeviceResult("gpu", "gpu-0")], "t"), reserved=("x",))
    run(GangController(SETTINGS, pods, claims=claims),
        [pod("m", "m"), pod("s", "s"), pod("r", "r")],
        [claim("m", MIG_CLASS, selector="device.attributes['gpu.nvidia.com'].profile == '3g.40gb'"),
         claim("s", SHARE_CLASS, share="250"), claim("r", count=2, constraints=root), held])
    got = allocations_(claims)
    assert devices(got["ml/m"])[0][0] == "mig-0000" and "-mig-3g40gb-" in devices(got["ml/m"])[0][1]
    [share] = got["ml/s"]["devices"]["results"]
    assert share["device"].endswith("-shared") and share["shareID"]
    assert share["consumedCapacity"] == {"share": "250", "memory": "0"}
    rooted = devices(got["ml/r"])
    node = rooted[0][0]
    gpus = sorted(int(d.split("-")[1]) for _, d in rooted)
    assert gpus in ([0, 1], [2, 3])  # one PCIe root (GPUs 0-1 and 2-3 are the two roots)
    assert node != "dra-0000" or gpus == [2, 3]  # gpu-0 is held there


def test_a_pod_gated_for_other_drivers_claims_is_let_go():
    pods, claims = RecordingPods(), RecordingClaims()
    run(GangController(SETTINGS, pods, claims=claims), [pod("n", "nic")], [claim("nic", "nic.example.com")])
    assert pods.calls == [("ungate", "ml/n")] and claims.calls == []


def test_a_pod_waits_for_its_claim_to_exist():
    pods, claims = RecordingPods(), RecordingClaims()
    controller = GangController(SETTINGS, pods, claims=claims)
    run(controller, [pod("p", "later")], [])
    assert pods.calls == [] and claims.calls == []
    assert "ResourceClaim ml/later not found" in controller.explain("ml/p")["error"]


def test_an_unsupported_claim_is_explained():
    pods, claims = RecordingPods(), RecordingClaims()
    controller = GangController(SETTINGS, pods, claims=claims)
    run(controller, [pod("p", "c")], [claim("c", MIG_CLASS)])
    assert claims.calls == [] and "needs a selector naming the profile" in controller.explain("ml/p")["error"]


def test_allocations_no_pod_will_use_are_cleared():
    old = rfc3339(NOW - 600)
    gone = claim("gone", alloc=allocation("dra-0000", [DeviceResult("gpu", "gpu-0")], old), by="u-gone")
    young = claim("young", alloc=allocation("dra-0000", [DeviceResult("gpu", "gpu-1")], rfc3339(NOW - 1)),
                  by="u-gone")
    used = claim("used", alloc=allocation("dra-0001", [DeviceResult("gpu", "gpu-0")], old), by="u-gone",
                 reserved=("x",))
    stuck = claim("stuck", count=4, alloc=allocation("dra-0001", [DeviceResult("gpu", "gpu-1")], old), by="u-p")
    claims = RecordingClaims()
    # p's gang cannot be completed: its other member needs 8 GPUs on one node.
    members = [pod("p", "stuck", group="g", size=2), pod("q", "big", group="g", size=2)]
    run(GangController(SETTINGS, RecordingPods(), claims=claims), members,
        [gone, young, used, stuck, claim("big", count=8)], live={"u-p", "u-q"})
    assert sorted(c[1] for c in claims.calls if c[0] == "deallocate") == ["ml/gone", "ml/stuck"]
