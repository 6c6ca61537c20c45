"""DRA node groups in the node scaler (issue 16; docs/devices.md, "DRA mode"): a group whose template is `dra: true`
is modelled from the ResourceSlices its nodes publish, pods held for their claims (the webhook's gate, no group) are
pending GPU pods whose demand is what their claims ask (a ResourceClaimTemplate's spec for a claim not generated yet),
a DRA node is GPU-ready once its slices are published, MIG pods open idle DRA GPUs, and scale-in counts allocated
claims as the GPUs in use."""
from __future__ import annotations

import copy

import pytest

from gpuaas.workloads import dra_claim_template, dra_pod_for_demand
from nodescaler.provider import DRA_TEMPLATE_ANNOTATION, REGISTERING_LABEL
from nodescaler.scalein import gpu_utilization, plan_scale_in
from nodescaler.scaleout import plan_scale_out
from nodescaler.snapshot import build_snapshot
from runtime.draslices import resource_slices
from runtime.pools import Pool
from scoring.draclaims import DeviceResult, allocation
from scoring.gangs import GANG_GATE
from scoring.model import MILLI, PodDemand

from .builders import A100X8, T0, booting_node, config, iso, nodes

DRA = {"dra": True, "gpu": {"model": "A100-80GB", "count": 4, "mig": "all-3g.40gb", "migGPUs": 2},
       "cpu": "64", "memory": "512Gi"}
GROUPS = [
    # Cheaper per node, but a device-plugin group: claim pods may not go there (scoring/model.py, "Channels").
    {"name": "plugin", "template": A100X8, "max_size": 10, "cost_per_hour": 5},
    {"name": "dra", "template": DRA, "max_size": 10, "cost_per_hour": 10},
]
WHOLE = PodDemand(1000, 1024, gpus=1, gpu_milli=MILLI, claims=True)
MIG = PodDemand(1000, 1024, gpus=1, gpu_milli=MILLI, mig_profile="3g.40gb", claims=True)
SHARE = PodDemand(1000, 1024, gpus=1, gpu_milli=250, claims=True)


def held(name: str, demand: PodDemand, *, created: float = T0 - 60) -> dict:
    """A pod as the webhook leaves it: its claim from a template, gated by gpuaas."""
    p = dra_pod_for_demand(name, "default", demand, gated=True)
    p["metadata"].update({"uid": f"uid-{name}", "creationTimestamp": iso(created)})
    p["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                       "reason": "SchedulingGated"}]}
    return p


def templates(*demands: PodDemand) -> list[dict]:
    return [dra_claim_template(d, "default") for d in demands]


def dra_node(name: str, created: float = T0 - 3600) -> tuple[dict, list[dict]]:
    """A node of the DRA group, Ready, with its slices published."""
    cfg = config(GROUPS)
    node = booting_node(cfg, "dra", name, created=created)
    pool = Pool.model_validate({**DRA, "name": "dra", "count": 1})
    return node, resource_slices(pool, name)


def claim(name: str, node: str, device: str, *, pod: str = "", share: int = 0) -> dict:
    """A claim allocated on `node` (reserved for `pod` when given)."""
    result = DeviceResult("gpu", device, share_id="s1", consumed={"share": share, "memory": 0}) if share else \
        DeviceResult("gpu", device)
    status: dict = {"allocation": allocation(node, [result], iso(T0 - 30))}
    if pod:
        status["reservedFor"] = [{"resource": "pods", "name": pod, "uid": f"uid-{pod}"}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
            "status": status}


def test_a_dra_group_is_modelled_from_the_slices_its_nodes_publish():
    group = config(GROUPS).group("dra")
    spec = group.node_spec("dra-x")
    assert (spec.dra, spec.gpus, spec.gpu_model, spec.mig_layouts) == (True, 4, "A100-80GB", None)
    assert not [r for r in group.template_node()["status"]["allocatable"] if r.startswith("nvidia.com/")]
    # MIG pods waiting: idle GPUs that offer the profile are opened for them, as few as cover the wait (GPUs 2, 3).
    assert group.node_spec("dra-x", {"3g.40gb": 1}).mig_layouts == (None, None, {"3g.40gb": 2}, None)
    assert group.node_spec("dra-x", {"3g.40gb": 3}).mig_layouts == (None, None, {"3g.40gb": 2}, {"3g.40gb": 2})
    assert config(GROUPS).group("plugin").node_spec("p", {"3g.40gb": 1}).dra is False


def test_the_kwok_provider_holds_a_dra_node_s_slices_back_until_its_ready_time():
    node = booting_node(config(GROUPS), "dra", "dra-abc")
    ann = node["metadata"]["annotations"]
    assert node["metadata"]["labels"][REGISTERING_LABEL] == "true"
    assert Pool.model_validate({**__import__("json").loads(ann[DRA_TEMPLATE_ANNOTATION]), "name": "dra",
                                "count": 1}).dra


def test_pods_held_for_their_claims_grow_the_dra_group_from_zero_not_the_cheaper_plugin_group():
    pods = [held("whole", WHOLE), held("mig", MIG), held("share", SHARE)]
    snap = build_snapshot([], pods, [], T0, templates=templates(WHOLE, MIG, SHARE))
    assert sorted(p.key for p in snap.pending) == ["default/mig", "default/share", "default/whole"]
    assert {p.key: p.known_demand.gpu_milli for p in snap.pending}["default/share"] == 250
    plan = plan_scale_out(snap, config(GROUPS))
    # One node of 4 GPUs: the whole GPU, the share on another, the 3g.40gb partition on an opened MIG GPU.
    assert [(g.group, g.count) for g in plan.grows] == [("dra", 1)], (plan.grows, plan.unplaceable)
    assert sorted(plan.grows[0].pods) == ["default/mig", "default/share", "default/whole"]


def test_without_its_template_or_claim_a_held_pod_asks_for_nothing_yet():
    snap = build_snapshot([], [held("whole", WHOLE)], [], T0, templates=[])
    assert snap.pending == [] and plan_scale_out(snap, config(GROUPS)).grows == []


def test_a_generated_claim_is_read_instead_of_its_template():
    p = held("two", WHOLE)
    p["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "two-gpu-x"}]
    generated = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": "two-gpu-x", "namespace": "default", "uid": "c2"},
                 "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                               "count": 2}}]}}}
    snap = build_snapshot([], [p], [], T0, claims=[generated], templates=templates(WHOLE))
    assert [p.known_demand.gpus for p in snap.pending] == [2]


def test_a_dra_node_is_capacity_on_its_way_until_its_slices_are_published_then_pods_fit_there():
    node, slices = dra_node("dra-abc", created=T0 - 5)
    pods = [held("whole", WHOLE), held("mig", MIG), held("share", SHARE)]
    tpl = templates(WHOLE, MIG, SHARE)
    booting = build_snapshot([copy.deepcopy(node)], pods, [], T0, templates=tpl)
    assert booting.nodes["dra-abc"].booting
    plan = plan_scale_out(booting, config(GROUPS))
    assert plan.grows == [] and sorted(plan.wait_upcoming) == ["default/mig", "default/share", "default/whole"]
    ready = build_snapshot([node], pods, [], T0, slices=slices, templates=tpl)
    assert not ready.nodes["dra-abc"].booting
    plan = plan_scale_out(ready, config(GROUPS))
    # The MIG pod too: the live node's idle MIG GPU is opened for it (without that, a second node would be grown).
    assert plan.grows == [] and sorted(plan.fit_now) == ["default/mig", "default/share", "default/whole"]


def test_dra_nodes_are_never_repartitioned_through_the_mig_manager_label():
    node, slices = dra_node("dra-0")
    mig_pods = [held(f"m{i}", MIG) for i in range(6)]  # more than its two MIG GPUs hold (2 x 2)
    plan = plan_scale_out(build_snapshot([node], mig_pods, [], T0, slices=slices, templates=templates(MIG)),
                          config(GROUPS))
    assert plan.mig == [] and [(g.group, g.count) for g in plan.grows] == [("dra", 1)]
    assert len(plan.fit_now) == 4


@pytest.fixture
def scale_in_cfg():
    return config(GROUPS, scale_in={"unneeded_s": 0, "delay_after_add_s": 0, "utilization_threshold": 0.5})


def bound(name: str, node: str, demand: PodDemand, claim_name: str) -> dict:
    p = dra_pod_for_demand(name, "default", demand)
    p["metadata"].update({"uid": f"uid-{name}", "creationTimestamp": iso(T0 - 600),
                          "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "controller": True,
                                               "apiVersion": "apps/v1", "uid": "o"}]})
    p["spec"]["nodeName"] = node
    p["status"] = {"phase": "Running", "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim_name}]}
    return p


def test_scale_in_counts_allocated_claims_as_the_gpus_in_use_and_moves_pods_with_them(scale_in_cfg):
    (a, slices_a), (b, slices_b) = dra_node("dra-a"), dra_node("dra-b")
    # dra-a: three of four GPUs held by claims of running pods; dra-b: one GPU.
    claims = [claim(f"c{i}", "dra-a", f"gpu-{i}", pod=f"a{i}") for i in range(3)] + \
             [claim("cb", "dra-b", "gpu-0", pod="b0")]
    pods = [bound(f"a{i}", "dra-a", WHOLE, f"c{i}") for i in range(3)] + [bound("b0", "dra-b", WHOLE, "cb")]
    snap = build_snapshot([a, b], pods, [], T0, slices=slices_a + slices_b, claims=claims)
    assert gpu_utilization(snap, "dra-a") == 0.75 and gpu_utilization(snap, "dra-b") == 0.25
    # The pod leaving dra-b takes a whole GPU along: dra-a has one left, so dra-b is drained, its pod evicted.
    r = plan_scale_in(snap, scale_in_cfg, {"dra-b": T0 - 10})
    assert [(c.node, c.method, c.pods) for c in r.commands] == [("dra-b", "Underutilized", ("default/b0",))]
    # With dra-a full, the pod has nowhere to go: dra-b stays.
    full = claims + [claim("c3", "dra-a", "gpu-3", pod="a3")]
    snap = build_snapshot([a, b], pods + [bound("a3", "dra-a", WHOLE, "c3")], [], T0, slices=slices_a + slices_b,
                          claims=full)
    r = plan_scale_in(snap, scale_in_cfg, {"dra-b": T0 - 10})
    assert r.commands == [] and r.skipped["dra-b"] == "pod default/b0 fits nowhere else"


def test_a_node_with_a_claim_allocated_for_a_pod_not_bound_yet_is_not_empty(scale_in_cfg):
    node, slices = dra_node("dra-a")
    snap = build_snapshot([node], [], [], T0, slices=slices, claims=[claim("c0", "dra-a", "gpu-0")])
    r = plan_scale_in(snap, scale_in_cfg, {"dra-a": T0 - 10})
    assert r.commands == [] and r.skipped["dra-a"] == \
        "claim default/c0 is allocated on it for a pod not bound yet"
    # Once nothing is allocated there, the empty node goes.
    r = plan_scale_in(build_snapshot([node], [], [], T0, slices=slices), scale_in_cfg, {"dra-a": T0 - 10})
    assert [(c.node, c.method) for c in r.commands] == [("dra-a", "Empty")]


def test_a_gang_member_with_claims_is_planned_with_the_gpus_its_claims_ask():
    members = []
    for i in range(2):
        p = held(f"g{i}", WHOLE)
        p["metadata"]["labels"]["gpuaas.io/gang"] = "g"
        p["metadata"]["annotations"]["gpuaas.io/gang-size"] = "2"
        members.append(p)
    snap = build_snapshot([], members, [], T0, templates=templates(WHOLE))
    assert snap.pending == [] and [m.known_demand.gpus for m in snap.waiting_gangs["default/g"]] == [1, 1]
    plan = plan_scale_out(snap, config(GROUPS))
    assert [(g.group, g.count) for g in plan.grows] == [("dra", 1)]


def test_plugin_pods_do_not_grow_the_dra_group():
    p = dra_pod_for_demand("x", "default", PodDemand(1000, 1024))  # CPU only, no claims
    p["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "1"
    p["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    p["metadata"].update({"uid": "u", "creationTimestamp": iso(T0 - 60)})
    p["status"] = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                       "reason": "Unschedulable", "lastTransitionTime": iso(T0 - 5)}]}
    assert GANG_GATE not in str(p)
    plan = plan_scale_out(build_snapshot(nodes("x", 0), [p], [], T0), config(GROUPS))
    assert [(g.group, g.count) for g in plan.grows] == [("plugin", 1)]


def test_a_pod_held_for_its_claims_triggers_a_reconcile_when_it_arrives(tmp_path):
    """The service reconciles at once (after its batching pause) for a pod turning pending; a pod the gang
    controller holds for its claims never turns Unschedulable, so its arrival, read with its template, is the
    trigger."""
    from types import SimpleNamespace

    from nodescaler.service import Service
    from runtime.drainformers import TEMPLATE_KIND
    from scoring.draview import CLAIM_KIND

    from .test_shutdown import KUBECONFIG

    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    svc = Service(config(GROUPS), tmp_path / "kubeconfig", identity="me")
    svc._apply_change("Pod", None, held("whole", WHOLE))
    assert not svc.trigger.is_set()  # no DRA informers (a cluster without resource.k8s.io/v1): not read
    svc.dra = {CLAIM_KIND: SimpleNamespace(store={}),
               TEMPLATE_KIND: SimpleNamespace(store={f"default/{t['metadata']['name']}": t for t in templates(WHOLE)})}
    svc._apply_change("Pod", None, held("whole", WHOLE))
    assert svc.trigger.is_set()


ROOTED = {"dra": True, "gpu": {"model": "A100-80GB", "count": 4, "topology": {"numaNode": 2}},
          "cpu": "64", "memory": "512Gi"}  # two PCIe roots of two GPUs each


def test_a_claim_for_gpus_under_one_pcie_root_does_not_fit_free_gpus_across_roots():
    from scoring.dra import PCIE_ROOT_ATTRIBUTE

    cfg = config([{"name": "rooted", "template": ROOTED, "max_size": 4, "cost_per_hour": 10}])
    node = booting_node(cfg, "rooted", "rooted-0", created=T0 - 3600)
    slices = resource_slices(Pool.model_validate({**ROOTED, "name": "rooted", "count": 1}), "rooted-0")
    assert cfg.group("rooted").pcie_roots == ("pci0000:00", "pci0000:00", "pci0000:10", "pci0000:10")
    # GPU 0 (first root) and GPU 2 (second root) held: two GPUs free, one on each root.
    used = [claim("u0", "rooted-0", "gpu-0", pod="r0"), claim("u2", "rooted-0", "gpu-2", pod="r2")]
    running = [bound("r0", "rooted-0", WHOLE, "u0"), bound("r2", "rooted-0", WHOLE, "u2")]
    two = PodDemand(1000, 1024, gpus=2, gpu_milli=MILLI, claims=True)
    plain, rooted = dra_claim_template(two, "default"), dra_claim_template(two, "default")
    rooted["metadata"]["name"] = "two-rooted"
    rooted["spec"]["spec"]["devices"]["constraints"] = [{"matchAttribute": PCIE_ROOT_ATTRIBUTE}]
    wants_root = held("rooted", two)
    wants_root["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = "two-rooted"

    snap = build_snapshot([node], running + [held("plain", two)], [], T0, slices=slices, claims=used,
                          templates=[plain])
    assert plan_scale_out(snap, cfg).fit_now == ["default/plain"]
    snap = build_snapshot([node], running + [wants_root], [], T0, slices=slices, claims=used, templates=[rooted])
    assert [p.same_root for p in snap.pending] == [2]
    plan = plan_scale_out(snap, cfg)
    assert plan.fit_now == [] and [(g.group, g.count, g.pods) for g in plan.grows] == \
        [("rooted", 1, ("default/rooted",))]
    # While that node boots, the pod waits for it (its template has a free root), and nothing more is grown.
    on_the_way = booting_node(cfg, "rooted", "rooted-new", created=T0 - 2)
    plan = plan_scale_out(build_snapshot([node, on_the_way], running + [wants_root], [], T0, slices=slices,
                                         claims=used, templates=[rooted]), cfg)
    assert plan.wait_upcoming == ["default/rooted"] and plan.grows == []


def test_new_dra_nodes_are_opened_for_mig_one_by_one_not_all_as_for_every_mig_pod():
    """5 pods of 3g.40gb and 5 of a whole GPU on nodes of 4 GPUs, 2 of them MIG-capable (two 3g.40gb each): one node
    with both MIG GPUs opened (4 partitions, 2 whole GPUs), one with one (1 partition, 3 whole GPUs): 2 nodes. With
    every new node opened as for all five MIG pods, each would keep 2 whole GPUs: 3 nodes."""
    pods = [held(f"m{i}", MIG) for i in range(5)] + [held(f"w{i}", WHOLE) for i in range(5)]
    plan = plan_scale_out(build_snapshot([], pods, [], T0, templates=templates(WHOLE, MIG)), config(GROUPS))
    assert [(g.group, g.count, len(g.pods)) for g in plan.grows] == [("dra", 2, 10)], plan.unplaceable


def test_an_idle_dra_node_a_waiting_mig_pod_fits_on_is_not_drained(scale_in_cfg):
    """The pod fits once one of the node's idle MIG GPUs is opened (the gang controller places it there): the node
    is kept for it, as a device-plugin node a pending pod fits on is."""
    node, slices = dra_node("dra-a")
    snap = build_snapshot([node], [held("m", MIG)], [], T0, slices=slices, templates=templates(MIG))
    r = plan_scale_in(snap, scale_in_cfg, {"dra-a": T0 - 10})
    assert r.commands == [] and r.skipped["dra-a"] == "pending pod default/m fits on it"
    # With no pod waiting, the same idle node goes.
    r = plan_scale_in(build_snapshot([node], [], [], T0, slices=slices), scale_in_cfg, {"dra-a": T0 - 10})
    assert [c.node for c in r.commands] == ["dra-a"]
