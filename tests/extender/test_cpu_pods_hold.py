"""The CPU-pods entry's filter (extender.service.ExtenderService.filter_cpu_pods): while pending GPU pods are planned
jointly, a pod asking for no GPU is held off the room planned for them, with a resolvable reason, for a bounded
time; GPU pods, pods with DRA claims and pods past the bound pass."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from extender.config import ExtenderConfig
from extender.metrics import Metrics
from extender.schedconfig import cpu_pods_entry
from extender.server import snapshot_app
from extender.service import BadRequest, ExtenderService, QueuePlanning
from extender.wire import ExtenderArgs
from scoring.clusterview import ClusterView
from scoring.verdicts import HELD_BESIDE_PLAN, HELD_FOR_EARLIER_GPU_PODS
from tests.conftest import Clock

from .fixtures import names, nodes, pending
from .test_queue_planning import NAMES, cluster
from .test_view import RecordingBinder

CREATED = 1_800_000_000.0  # the pods' creationTimestamp, 2027-01-15T08:00:00Z
MAX_WAIT = 120.0


def created(pod: dict[str, Any]) -> dict[str, Any]:
    pod["metadata"]["creationTimestamp"] = "2027-01-15T08:00:00Z"
    return pod


def service(pods: dict[str, dict[str, Any]], wall: Clock, min_pods: int = 1) -> ExtenderService:
    """First fit: the plan puts the first GPU pod on a-0000. `wall`: the clock creation times are judged by."""
    svc = cluster(QueuePlanning(min_pods=min_pods, refresh_s=1000.0, max_wait_s=MAX_WAIT), pods, Clock())
    svc.wall_clock = wall
    return svc


def filtered(svc: ExtenderService, pod: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    result = svc.filter_cpu_pods(ExtenderArgs(Pod=pod, NodeNames=NAMES))
    return result.NodeNames or [], result.FailedNodes


def test_a_pod_asking_for_no_gpu_goes_where_it_fits_beside_the_planned_gpu_pods():
    """A GPU pod waits (4 GPUs, 24 of a node's 32 cores) and is planned on a-0000; a pod asking for 16 cores would
    leave it no room there, so only a-0001 passes, and a-0000 is failed with the reason. The GPU pod itself, at this
    entry, gets both nodes back; without a plan (fewer waiting GPU pods than min_pods) every node passes."""
    pods = {"ml/train": created(pending("train", gpus=4, cpu="24")), "ml/etl": created(pending("etl", cpu="16"))}
    svc = service(pods, Clock(CREATED + 1))
    assert filtered(svc, pods["ml/etl"]) == (["a-0001"], {"a-0000": HELD_BESIDE_PLAN})
    assert filtered(svc, pods["ml/train"]) == (NAMES, {})
    assert filtered(service(pods, Clock(CREATED + 1), min_pods=2), pods["ml/etl"]) == (NAMES, {})


def test_a_pod_that_fits_nowhere_beside_the_plan_waits_at_most_max_wait():
    """Two GPU pods planned, one per node, each leaving 8 cores: a pod asking for 16 cores fits beside them nowhere.
    It waits (every node failed, resolvable: kube-scheduler tries it again) until MAX_WAIT after its creation; from
    then on it is not held, so no such pod waits for ever behind GPU pods."""
    pods = {"ml/t1": created(pending("t1", gpus=4, cpu="24")), "ml/t2": created(pending("t2", gpus=4, cpu="24")),
            "ml/etl": created(pending("etl", cpu="16"))}
    wall = Clock(CREATED + MAX_WAIT - 1)
    svc = service(pods, wall)
    assert filtered(svc, pods["ml/etl"]) == ([], dict.fromkeys(NAMES, HELD_BESIDE_PLAN))
    wall.t = CREATED + MAX_WAIT
    assert filtered(svc, pods["ml/etl"]) == (NAMES, {})


def test_a_pod_with_dra_claims_is_not_held():
    """A pod asking through ResourceClaims reads as CPU and memory only, but it is the gang controller's: released,
    it is pinned where its claims are allocated and must not be held off its only node."""
    pods = {"ml/train": created(pending("train", gpus=4, cpu="24"))}
    dra = created(pending("dra", cpu="16"))
    dra["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    svc = service(pods, Clock(CREATED + 1))
    assert filtered(svc, dra) == (NAMES, {})


def test_the_planned_room_is_kept_between_plans():
    """The plan is made once (refresh_s 1000): the first pod asking for no GPU, ranked onto a-0001, is held in the
    plan's reserved model too, so the second one (8 cores) is judged beside it: a-0001 has 32 - 16 = 16 cores left,
    a-0000 only 8 beside the planned GPU pod, and 24 would fit nowhere; a third, of 24 cores, waits."""
    pods = {"ml/train": created(pending("train", gpus=4, cpu="24"))}
    svc = service(pods, Clock(CREATED + 1))
    first = created(pending("etl-1", cpu="16"))
    fits, _ = filtered(svc, first)
    assert svc.prioritize_cpu_pods(ExtenderArgs(Pod=first, NodeNames=fits)).pick == "a-0001"
    assert filtered(svc, created(pending("etl-2", cpu="8"))) == (NAMES, {})
    assert filtered(svc, created(pending("etl-3", cpu="24")))[0] == []


def test_a_creation_time_that_is_no_time_is_refused():
    pod = pending("etl", cpu="1")
    pod["metadata"]["creationTimestamp"] = "yesterday"
    with pytest.raises(BadRequest, match="creationTimestamp 'yesterday' is not an RFC 3339 time"):
        service({"ml/train": created(pending("train", gpus=4))}, Clock(CREATED)).filter_cpu_pods(
            ExtenderArgs(Pod=pod, NodeNames=NAMES))


def test_the_entry_and_its_route():
    """kube-scheduler calls the entry's filterVerb at urlPrefix/filter: /cpu/filter answers the wire's filter result
    (every node for a GPU pod, without a plan every node for the others), and a body that is no pod is a 400."""
    assert cpu_pods_entry("http://x")["filterVerb"] == "filter"

    async def go():
        async with TestClient(TestServer(snapshot_app(ExtenderConfig(), nodes()))) as c:
            out = []
            for body in ({"Pod": pending("g", gpus=1), "NodeNames": names()},
                         {"Pod": pending("web", cpu="2"), "NodeNames": names()}, {"NodeNames": names()}):
                resp = await c.post("/cpu/filter", data=json.dumps(body), headers={"Content-Type": "application/json"})
                out.append((resp.status, await resp.json()))
            return out

    (gpu_status, gpu), (cpu_status, cpu), (bad_status, bad) = asyncio.run(go())
    assert gpu_status == cpu_status == 200 and gpu["NodeNames"] == cpu["NodeNames"] == names()
    assert gpu["FailedNodes"] == cpu["FailedNodes"] == {} and gpu["Error"] == ""
    assert bad_status == 400 and "Pod" in bad["error"]


def test_a_released_dra_pod_keeps_its_room_until_it_binds():
    """A pod with DRA claims released onto a-0000 (the gang controller pinned it there and removed its gate) asks 24
    cores there, which kube-scheduler does not count until it binds. The plan keeps them: a pod asking for 16 cores
    is held off a-0000 while it is not bound, and passes once it is (its cores are then counted as bound)."""
    dra = created(pending("dra", cpu="24"))
    dra["spec"].update(resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                       nodeSelector={"kubernetes.io/hostname": "a-0000"})
    svc = service({"ml/dra": dra}, Clock(CREATED + 1))
    etl = created(pending("etl", cpu="16"))
    assert filtered(svc, etl) == (["a-0001"], {"a-0000": HELD_BESIDE_PLAN})
    svc.view.on_change("Pod", dra, {**dra, "spec": {**dra["spec"], "nodeName": "a-0000"},
                                    "status": {"phase": "Running"}})
    assert "ml/dra" not in svc.view.queue and filtered(svc, etl) == (NAMES, {})


def test_a_pod_waits_for_the_dra_pods_that_arrived_before_it():
    """A pod gpuaas holds for its claim (two GPUs) was created at 08:00:00: the gang controller places it in its next
    round. A pod asking for no GPU created after it waits for that round (every node failed with the reason), as
    placing pods in arrival order would have placed the GPU pod first; one created before it is only kept beside the
    plan; once the later pod has waited MAX_WAIT it is not held."""
    from tests.scoring.test_dramodel import WHOLE, cluster_objects
    from tests.scoring.test_draview import gated_pod_with_two_gpu_claim

    nodes_, slices = cluster_objects(WHOLE)
    view = ClusterView("gpuaas", clock=Clock())
    for n in nodes_.values():
        view.on_change("Node", None, n)
    for s in slices:
        view.on_change("ResourceSlice", None, s)
    pod, claim = gated_pod_with_two_gpu_claim()
    pod["metadata"]["creationTimestamp"] = "2027-01-15T08:00:00Z"
    view.on_change("Pod", None, pod)
    view.on_change("ResourceClaim", None, claim)

    async def lookup(namespace: str, name: str) -> dict[str, Any] | None:
        return None

    wall = Clock(CREATED + 10)
    svc = ExtenderService(view, RecordingBinder(), Metrics(), lookup, wall_clock=wall,
                          queue_planning=QueuePlanning(min_pods=1, refresh_s=1000.0, max_wait_s=MAX_WAIT))
    dra_nodes = sorted(nodes_)
    later, earlier = pending("later", cpu="2"), pending("earlier", cpu="2")
    later["metadata"]["creationTimestamp"] = "2027-01-15T08:00:01Z"
    earlier["metadata"]["creationTimestamp"] = "2027-01-15T07:59:59Z"
    held = svc.filter_cpu_pods(ExtenderArgs(Pod=later, NodeNames=dra_nodes))
    assert held.NodeNames == [] and held.FailedNodes == dict.fromkeys(dra_nodes, HELD_FOR_EARLIER_GPU_PODS)
    assert svc.filter_cpu_pods(ExtenderArgs(Pod=earlier, NodeNames=dra_nodes)).NodeNames == dra_nodes
    wall.t = CREATED + 1 + MAX_WAIT
    assert svc.filter_cpu_pods(ExtenderArgs(Pod=later, NodeNames=dra_nodes)).NodeNames == dra_nodes


def test_a_dra_pod_released_after_the_plan_was_made_is_planned_at_once():
    """The plan is made (refresh_s 1000) while a GPU pod waits; then a DRA pod is released onto a-0000 with 24 cores.
    The next pod asking for no GPU finds it in the plan, not refresh_s later: it is held off a-0000."""
    pods = {"ml/train": created(pending("train", gpus=1, cpu="1"))}
    svc = service(pods, Clock(CREATED + 1))
    etl = created(pending("etl", cpu="16"))
    assert filtered(svc, etl) == (NAMES, {})
    dra = created(pending("dra", cpu="24"))
    dra["spec"].update(resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                       nodeSelector={"kubernetes.io/hostname": "a-0000"})
    svc.view.on_change("Pod", None, dra)
    assert filtered(svc, etl) == (["a-0001"], {"a-0000": HELD_BESIDE_PLAN})


def test_a_released_dra_pod_the_plan_leaves_out_does_not_update_it_at_every_filter(monkeypatch):
    """A DRA pod released onto a-0000 asks more cores than a-0000 has (40 of 32): the plan leaves it out. Being
    pinned and not planned, it brings the plan's update forward once, not at every later filter (it did at every
    CPU-pods filter call: 382 updates in one 200-node DRA burst)."""
    import extender.service as service_module

    pods = {"ml/train": created(pending("train", gpus=1, cpu="1"))}
    svc = service(pods, Clock(CREATED + 1))
    etl = created(pending("etl", cpu="16"))
    filtered(svc, etl)
    dra = created(pending("dra", cpu="40"))
    dra["spec"].update(resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                       nodeSelector={"kubernetes.io/hostname": "a-0000"})
    svc.view.on_change("Pod", None, dra)
    plans: list[str] = []
    for made in ("plan_queue", "update_plan"):
        real = getattr(service_module, made)
        monkeypatch.setattr(service_module, made,
                            lambda *a, real=real, made=made, **k: (plans.append(made), real(*a, **k))[1])
    for _ in range(3):
        filtered(svc, etl)
    assert svc.plan is not None and "ml/dra" in svc.plan.left_out
    assert len(plans) == 1
