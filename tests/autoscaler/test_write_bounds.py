"""Issue 13, defect 2, for the replica autoscaler as for the node scaler: every Kubernetes call is bounded by a request
timeout, and the replica writes only while its lease holds for at least that long, so that a write started by a
replica that then stops leading cannot land under its successor."""
from __future__ import annotations

from types import SimpleNamespace

from autoscaler.config import Target
from autoscaler.controller import KubeTargets, Observed
from autoscaler.service import AutoscalerService


class Recorder:
    """Any API method: records (name, kwargs) and answers with an object shaped like the client's models."""

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, kwargs))
            return SimpleNamespace(
                spec=SimpleNamespace(replicas=2, selector=SimpleNamespace(match_labels={"app": "x"})),
                status=SimpleNamespace(selector="app=x"), metadata=SimpleNamespace(uid="u", annotations={}),
                items=[])
        return call


def test_every_call_of_the_autoscaler_carries_the_request_timeout():
    targets = KubeTargets(api=None, request_timeout=4.0)
    targets.apps, targets.core = Recorder(), Recorder()
    t = Target(deployment="llm", namespace="inf")
    observed = targets.observe(t)
    targets.scale(t, 3)
    targets.event(t, Observed(replicas=2, pods=frozenset(), pending=frozenset(), uid="u", annotations={}),
                  "Normal", "ScaleUp", "x")
    targets.set_conditions(t, [])
    calls = targets.apps.calls + targets.core.calls
    assert {name for name, _ in calls} == {
        "read_namespaced_deployment", "read_namespaced_deployment_scale", "list_namespaced_pod",
        "patch_namespaced_deployment_scale", "create_namespaced_event", "patch_namespaced_deployment"}
    assert all(kwargs.get("_request_timeout") == 4.0 for _, kwargs in calls), calls
    assert observed.replicas == 2


def test_every_read_of_the_idle_gpu_look_carries_the_request_timeout():
    from autoscaler.idle import KubeWorkloads

    workloads = KubeWorkloads.__new__(KubeWorkloads)
    workloads.core, workloads.apps, workloads.batch = Recorder(), Recorder(), Recorder()
    workloads.namespace, workloads.timeout = None, 4.0
    workloads.core.api_client = SimpleNamespace(sanitize_for_serialization=lambda o: o)
    workloads.read()
    calls = workloads.core.calls
    assert [name for name, _ in calls] == ["list_pod_for_all_namespaces"]
    assert all(kwargs.get("_request_timeout") == 4.0 for _, kwargs in calls), calls


def test_the_autoscaler_writes_only_while_the_lease_holds_for_a_whole_request_timeout(monkeypatch):
    import autoscaler.service as service_module

    valid_for = {"s": 5.0}

    class Elector:
        identity, write_timeout = "replica-a", 4.0

        def may_write(self, timeout):
            return valid_for["s"] >= timeout

        def is_leader(self):
            return valid_for["s"] > 0

    built = {}
    monkeypatch.setattr(service_module, "kube_api", lambda kubeconfig: object())
    monkeypatch.setattr(service_module.LeaderElector, "from_config", classmethod(lambda cls, *a, **k: Elector()))
    monkeypatch.setattr(service_module, "build", lambda config, **kwargs: built.update(kwargs) or SimpleNamespace())
    config = SimpleNamespace(leader_election=SimpleNamespace(enabled=True, renew_deadline_s=10.0, retry_period_s=2.0),
                             idle_gpus=SimpleNamespace(enabled=False))
    AutoscalerService(config)
    assert built["request_timeout"] == 4.0
    may_act = built["may_act"]
    assert may_act()
    valid_for["s"] = 3.0  # still the leader, but a 4 s write could outlive the lease
    assert not may_act()
