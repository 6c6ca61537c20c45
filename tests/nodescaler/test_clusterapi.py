"""The clusterapi provider: node groups read from annotated MachineDeployments, launch failures read from a Machine's
InfrastructureReady condition, the config rules, and the provider's writes (scale through /scale, a drained node's
Machine marked, then replicas lowered once) against an in-memory MachineDeployment and its Machines (the MachineSet's
part, creating and deleting Machines, is played by the test). tests/e2e/test_nodescaler_clusterapi.py runs the real
Cluster API core manager."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from kubernetes.client.rest import ApiException

from nodescaler.clusterapi import (
    COST_ANNOTATION,
    DELETE_MACHINE,
    EXCLUDE_DRAINING,
    MAX_SIZE,
    MIN_SIZE,
    ClusterAPIProvider,
    group_from_machine_deployment,
    launch_problem,
)
from nodescaler.config import NodeScalerConfig
from nodescaler.provider import NodeNotFound, ProviderError

from .builders import A100X8, T0

CA = "capacity.cluster-autoscaler.kubernetes.io/"
LABEL = "gpuaas.io/node-group"
ANN = {MIN_SIZE: "1", MAX_SIZE: "12", CA + "cpu": "96", CA + "memory": "768Gi", CA + "gpu-count": "8",
       CA + "gpu-type": "nvidia.com/gpu", CA + "labels": "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3,team=ml",
       CA + "taints": "nvidia.com/gpu=present:NoSchedule", COST_ANNOTATION: "98.3"}


def md(annotations: dict, labels: dict | None = None) -> dict:
    return {"metadata": {"name": "gpu-h100", "namespace": "fleet", "annotations": annotations,
                         "labels": {LABEL: "h100x8"} if labels is None else labels}}


def test_a_machinedeployment_annotated_as_cluster_autoscaler_reads_it_is_a_node_group():
    g = group_from_machine_deployment(md(ANN), LABEL)
    assert (g.name, g.min_size, g.max_size, g.cost_per_hour, g.provider) == ("h100x8", 1, 12, 98.3, "clusterapi")
    assert (g.clusterapi.namespace, g.clusterapi.machine_deployment) == ("fleet", "gpu-h100")
    spec = g.node_spec("n")
    assert spec.gpu_model == "H100-80GB" and spec.gpus == 8 and spec.cpu_milli == 96000
    labels, taints = g.template_constraints()
    assert labels["team"] == "ml" and labels["gpuaas.io/pool"] == "h100x8"
    assert [tuple(t)[:3] for t in taints] == [("nvidia.com/gpu", "present", "NoSchedule")]


def test_a_mig_layout_comes_from_the_labels_annotation():
    g = group_from_machine_deployment(md({**ANN, CA + "labels": "nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB,"
                                          "nvidia.com/mig.config=all-1g.10gb"}), LABEL)
    assert g.template["gpu"] == {"model": "NVIDIA-A100-SXM4-80GB", "count": 8, "mig": "all-1g.10gb"}


@pytest.mark.parametrize("change, words", [
    ({MAX_SIZE: None}, "missing annotations cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size"),
    ({COST_ANNOTATION: None}, "missing annotations gpuaas.io/cost-per-hour"),
    ({CA + "gpu-type": "amd.com/gpu"}, "only nvidia.com/gpu"),
    ({CA + "labels": "team=ml"}, "must name the GPU as nvidia.com/gpu.product"),
    ({CA + "taints": "nvidia.com/gpu=present"}, "is not key=value:Effect"),
    ({CA + "labels": "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3,oops"}, "'oops' is not key=value"),
    ({MIN_SIZE: "20"}, "min_size 20 is more than max_size 12"),
    ({CA + "gpu-count": "eight"}, "invalid literal"),
])
def test_a_machinedeployment_that_is_no_group_is_refused_naming_it_and_what_is_wrong(change, words):
    ann = {k: v for k, v in {**ANN, **change}.items() if v is not None}
    with pytest.raises(ValueError, match="MachineDeployment fleet/gpu-h100: ") as err:
        group_from_machine_deployment(md(ann), LABEL)
    assert words in str(err.value)


@pytest.mark.parametrize("conditions, v1beta1, problem", [
    ([], {}, None),
    ([{"type": "InfrastructureReady", "status": "False", "reason": "NotReady"}], {}, None),  # core's fallback
    ([{"type": "InfrastructureReady", "status": "True", "reason": "Provisioned"}], {}, None),
    ([{"type": "InfrastructureReady", "status": "False", "reason": "InsufficientCapacity", "message": "zone a"}], {},
     "InfrastructureReady False: InsufficientCapacity: zone a"),
    ([], {"failureReason": "CreateError", "failureMessage": "quota"}, "CreateError: quota"),
])
def test_a_launch_failure_is_an_infrastructure_ready_reason_the_group_names(conditions, v1beta1, problem):
    m = {"status": {"conditions": conditions, "deprecated": {"v1beta1": v1beta1}}}
    assert launch_problem(m, ["InsufficientCapacity"]) == problem


def groups(*extra: dict) -> list[dict]:
    return [{"name": "a", "template": A100X8, "max_size": 5, "cost_per_hour": 10, "provider": "clusterapi",
             "clusterapi": {"namespace": "fleet", "machine_deployment": "md-a"}}, *extra]


def test_config_rules_for_clusterapi_groups():
    with pytest.raises(ValueError, match="provider clusterapi needs a clusterapi section"):
        NodeScalerConfig.model_validate({"groups": [{**groups()[0], "clusterapi": None}]})
    with pytest.raises(ValueError, match="MachineDeployments in more than one group: fleet/md-a"):
        NodeScalerConfig.model_validate({"groups": groups({**groups()[0], "name": "b"})})
    with pytest.raises(ValueError, match="at least one node group"):
        NodeScalerConfig.model_validate({"groups": []})
    cfg = NodeScalerConfig.model_validate({"groups": [], "clusterapi_discovery": {"enabled": True}})
    found = group_from_machine_deployment(md(ANN), LABEL)
    same_md = group_from_machine_deployment(
        {"metadata": {"name": "md-a", "namespace": "fleet", "annotations": ANN, "labels": {LABEL: "x"}}}, LABEL)
    merged = NodeScalerConfig.model_validate({"groups": groups()}).with_groups([found, same_md])
    assert [g.name for g in merged.groups] == ["a", "h100x8"], "a configured group wins over a discovered one"
    assert [g.name for g in cfg.with_groups([found]).groups] == ["h100x8"]


# ---- the provider against an in-memory MachineDeployment -------------------------------------------------------------
class FakeCapi:
    """One MachineDeployment's scale and Machines, and Nodes; the test plays the MachineSet (`reconcile`)."""

    def __init__(self) -> None:
        self.replicas, self.rv = 0, 1
        self.machines: dict[str, dict] = {}
        self.nodes: dict[str, dict] = {}
        self.conflicts = 0  # the next patches of the scale that answer 409
        self.n = 0
        self.stalled = False  # the MachineSet makes no Machines

    @staticmethod
    def _resp(obj):
        return SimpleNamespace(data=json.dumps(obj).encode())

    def get_namespaced_custom_object_scale(self, group, version, ns, plural, name, **_):
        return self._resp({"metadata": {"resourceVersion": str(self.rv)}, "spec": {"replicas": self.replicas}})

    def patch_namespaced_custom_object_scale(self, group, version, ns, plural, name, body, **_):
        if self.conflicts or body["metadata"]["resourceVersion"] != str(self.rv):
            self.conflicts = max(0, self.conflicts - 1)
            self.rv += 1
            raise ApiException(status=409, reason="Conflict")
        self.replicas, self.rv = body["spec"]["replicas"], self.rv + 1
        self.reconcile()

    def list_namespaced_custom_object(self, group, version, ns, plural, **_):
        return self._resp({"items": list(self.machines.values())})

    def patch_namespaced_custom_object(self, group, version, ns, plural, name, body, **_):
        m = self.machines[name]
        m["metadata"].setdefault("annotations", {}).update(body["metadata"]["annotations"])
        return self._resp(m)

    def read_node(self, name, **_):
        if name not in self.nodes:
            raise ApiException(status=404, reason="Not Found")
        return self._resp(self.nodes[name])

    def reconcile(self) -> None:
        """The MachineSet: create Machines up to replicas, delete marked ones first (then the newest) down to it."""
        while len(self.machines) < self.replicas and not self.stalled:
            name = f"md-a-{self.n}"
            self.n += 1
            self.machines[name] = {"metadata": {"name": name, "namespace": "fleet", "resourceVersion": "1",
                                                "creationTimestamp": "2026-01-01T00:00:00Z"}, "status": {}}
        order = sorted(self.machines, key=lambda m: (DELETE_MACHINE not in self.machines[m]["metadata"].get(
            "annotations", {}), -int(m.rsplit("-", 1)[1])))
        for name in order[:max(0, len(self.machines) - self.replicas)]:
            del self.machines[name]
            self.nodes.pop(f"node-{name}", None)

    def register(self, machine: str) -> str:
        node = f"node-{machine}"
        self.machines[machine]["status"]["nodeRef"] = {"name": node}
        self.nodes[node] = {"metadata": {"name": node, "annotations": {"cluster.x-k8s.io/machine": machine}},
                            "spec": {"providerID": f"kwok://{node}"}}
        return node


def provider(api: FakeCapi) -> tuple[ClusterAPIProvider, NodeScalerConfig]:
    cfg = NodeScalerConfig.model_validate({"groups": groups()})
    p = ClusterAPIProvider(None, lambda: cfg.groups, clock=lambda: T0, machine_wait_s=0.5)
    p.custom, p.core = api, api  # type: ignore[assignment]
    return p, cfg


def test_grow_raises_replicas_and_returns_the_machines_status_reads_back_those_without_a_node():
    api = FakeCapi()
    p, cfg = provider(api)
    api.conflicts = 2  # someone else scaled meanwhile: read again, then apply
    names = p.grow(cfg.groups[0], 3)
    assert api.replicas == 3 and sorted(names) == sorted(api.machines)
    api.register(names[0])
    st = p.status(T0)
    assert sorted(r.name for r in st.in_flight) == sorted(names[1:]) and st.failures == []


def test_scale_in_marks_the_drained_machine_and_lowers_replicas_once_so_exactly_it_goes():
    api = FakeCapi()
    p, cfg = provider(api)
    g = cfg.groups[0]
    names = p.grow(g, 4)
    nodes = [api.register(m) for m in names]
    p.delete_node(g, nodes[1])  # not the newest: the MachineSet would pick the newest without the mark
    assert api.replicas == 3 and names[1] not in api.machines and len(api.machines) == 3
    # A repeated call for a Machine marked and scaled for already (a crash after the scale): replicas stay.
    m = api.machines[names[2]]
    m["metadata"]["annotations"] = {DELETE_MACHINE: "gpuaas-nodescaler", "gpuaas.io/scale-down-from": "4"}
    p._remove(g, m, "test")
    assert api.replicas == 3
    with pytest.raises(NodeNotFound):
        p.delete_node(g, nodes[1])
    api.nodes["stranger"] = {"metadata": {"name": "stranger"}, "spec": {"providerID": "aws:///i-1"}}
    with pytest.raises(ProviderError, match="is no Machine of MachineDeployment fleet/md-a"):
        p.delete_node(g, "stranger")


def test_the_mark_says_gpuaas_drained_the_node():
    api = FakeCapi()
    p, cfg = provider(api)
    names = p.grow(cfg.groups[0], 2)
    api.register(names[0])
    seen = {}
    orig = api.patch_namespaced_custom_object

    def patch(*args, **kw):
        seen.update(args[5]["metadata"]["annotations"])
        return orig(*args, **kw)

    api.patch_namespaced_custom_object = patch  # type: ignore[method-assign]
    p.delete_node(cfg.groups[0], f"node-{names[0]}")
    assert DELETE_MACHINE in seen and EXCLUDE_DRAINING in seen and seen["gpuaas.io/scale-down-from"] == "2"


def test_replicas_without_a_machine_yet_are_on_their_way_as_placeholders_and_withdrawn_by_lowering_replicas():
    api = FakeCapi()
    p, cfg = provider(api)
    g = cfg.groups[0]
    p.grow(g, 1)
    api.stalled = True  # the MachineSet lags (or is broken): no Machines for the next 2
    names = p.grow(g, 2)
    assert api.replicas == 3 and names == ["md-a#replica-0", "md-a#replica-1"]
    st = p.status(T0 + 5)
    assert sorted(r.name for r in st.in_flight) == ["md-a#replica-0", "md-a#replica-1", "md-a-0"]
    assert st.complete == {"a"} and all(r.requested_at == T0 for r in st.in_flight if "#" in r.name)
    p.cancel(g, "md-a#replica-1")  # expired: lower replicas, they were more than the Machines
    assert api.replicas == 2
    api.stalled = False
    api.reconcile()
    assert sorted(r.name for r in p.status(T0 + 6).in_flight) == ["md-a-0", "md-a-1"]
    p.cancel(g, "md-a#replica-0")  # a placeholder whose Machine came meanwhile: replicas stay
    assert api.replicas == 2


def test_a_remembered_request_no_longer_listed_for_a_complete_group_is_not_on_its_way_any_more():
    from nodescaler.controller import NodeScaler
    from nodescaler.provider import ProviderStatus, Requested
    from nodescaler.scaleout import Upcoming

    cfg = NodeScalerConfig.model_validate({"groups": groups()})

    class Status:
        def grow(self, group, count):
            return []

        def delete_node(self, group, name):
            pass

        def status(self, now):
            return ProviderStatus(in_flight=[Requested("md-a-7", "a", T0)], complete={"a"})

    scaler = NodeScaler(cfg, lambda now: None, None, Status())  # type: ignore[arg-type]
    scaler.memory.requested = [Upcoming("md-a#replica-0", "a", T0 + 100), Upcoming("other", "b", T0 + 100)]
    snap = SimpleNamespace(registered=lambda name: False)
    scaler._provider_status(T0, snap)  # type: ignore[arg-type]
    assert [u.name for u in scaler.memory.requested] == ["other", "md-a-7"]
