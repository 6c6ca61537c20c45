"""Two `gpuaas autoscaler` processes behind one Lease against the session cluster: only the leader scales and writes
events (the standby syncs and writes nothing), and after the leader is SIGKILLed the standby takes over, not before
the dead leader's last renewal expired, and acts. How fast is bench/leader_takeover.py's number, not a bound here.
Both run with a ServiceAccount granted exactly AUTOSCALER_RULES and LEASE_RULES: what the autoscaler needs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from kubernetes import client, watch

from gpuaas.cluster.components import ComponentProcess
from gpuaas.cluster.prometheus import PrometheusServer
from gpuaas.workloads import gpu_deployment

from .kube import lease_rules, rbac_manifest, wait_for

REPO = Path(__file__).resolve().parents[2]
LEASE = "gpuaas-autoscaler"
# Everything `gpuaas autoscaler` does with the API (autoscaler/controller.py KubeTargets, runtime/leader.py).
AUTOSCALER_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "patch"]},  # patch: the conditions
    {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]
LEASE_RULES = lease_rules(LEASE)  # in the autoscaler's own namespace
LEASE_S, RENEW_DEADLINE_S, RETRY_S = 4, 3, 0.5


@pytest.fixture(scope="module")
def prometheus(cluster, tmp_path_factory):
    """A Prometheus with nothing to scrape: the autoscaler validates its queries against it at start, then finds no
    data (MetricsUnavailable), which is enough to make it act on min_replicas."""
    server = PrometheusServer(tmp_path_factory.mktemp("prometheus-leader"), targets=[], scrape_interval="1s")
    server.start()
    yield server
    server.stop()


def autoscaler(workdir: Path, kubeconfig: Path, config: Path, identity: str) -> ComponentProcess:
    proc = ComponentProcess(identity, [], workdir)
    proc.args = ["autoscaler", "--config", str(config), "--kubeconfig", str(kubeconfig), "--host", "127.0.0.1",
                 "--port", str(proc.port), "--identity", identity, "--verbose"]
    return proc


def status(proc: ComponentProcess) -> dict:
    with urllib.request.urlopen(f"{proc.url}/leader", timeout=5) as resp:
        return json.loads(resp.read())


def replicas(api, ns) -> int:
    return client.AppsV1Api(api).read_namespaced_deployment_scale("llm", ns).spec.replicas


def event_instances(api, ns) -> list[str]:
    items = client.CoreV1Api(api).list_namespaced_event(ns, field_selector="involvedObject.name=llm").items
    return [e.reporting_instance for e in items if e.reporting_component == "gpuaas-autoscaler"]


def lease_records(api, namespace: str, since: str, *, until_holder: str) -> list:
    """The Lease's specs as written after resourceVersion `since`, in order, up to the first held by `until_holder`."""
    out = []
    w = watch.Watch()
    for event in w.stream(client.CoordinationV1Api(api).list_namespaced_lease, namespace, resource_version=since,
                          field_selector=f"metadata.name={LEASE}", timeout_seconds=30):
        out.append(event["object"].spec)
        if out[-1].holder_identity == until_holder:
            w.stop()
    return out


def test_two_autoscalers_only_the_leader_scales_and_the_other_takes_over(cluster, namespace, prometheus, tmp_path):
    api = cluster.api
    client.AppsV1Api(api).create_namespaced_deployment(namespace, gpu_deployment("llm", namespace, gpus=1))
    rbac = tmp_path / "rbac.yaml"
    rbac.write_text(rbac_manifest("gpuaas-autoscaler", namespace, cluster_rules=AUTOSCALER_RULES,
                                  namespace_rules=LEASE_RULES))
    kubeconfig = cluster.service_account_kubeconfig(rbac, "gpuaas-autoscaler", namespace=namespace)
    config = tmp_path / "autoscaler.yaml"
    config.write_text(yaml.safe_dump({
        "prometheus": {"url": prometheus.url, "timeout_s": 2}, "interval_s": 1,
        "leader_election": {"namespace": namespace, "lease_duration_s": LEASE_S, "renew_deadline_s": RENEW_DEADLINE_S,
                            "retry_period_s": RETRY_S},
        # no data in Prometheus: the count is held, but never below min_replicas, so the leader scales 1 -> 2
        "targets": [{"deployment": "llm", "namespace": namespace, "min_replicas": 2, "max_replicas": 4}]}))
    a, b = autoscaler(tmp_path, kubeconfig, config, "as-a"), autoscaler(tmp_path, kubeconfig, config, "as-b")
    a.start(timeout=60)
    b.start(timeout=60)
    try:
        leaders = wait_for(lambda: [p for p in (a, b) if status(p)["leader"]], timeout=60, what="a leader")
        assert len(leaders) == 1
        leader, standby = leaders[0], (b if leaders[0] is a else a)
        wait_for(lambda: replicas(api, namespace) == 2, timeout=30, what="the leader scaling llm to min_replicas")
        wait_for(lambda: status(standby)["syncs"] >= 3, timeout=30, what="the standby syncing")
        before = event_instances(api, namespace)
        assert before and set(before) == {leader.name}, before  # MetricsUnavailable and the scale: the leader's
        assert status(standby)["syncs_as_leader"] == 0 and status(leader)["syncs_as_leader"] >= 1

        # a third replica's one-shot sync refuses while the lease is held
        once = subprocess.run([sys.executable, "-m", "gpuaas.cli", "autoscaler", "--config", str(config),
                               "--kubeconfig", str(kubeconfig), "--once", "--identity", "as-once"],
                              capture_output=True, text=True, cwd=REPO, timeout=60,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        assert once.returncode == 1 and f"is held by {leader.name}" in once.stderr, once.stderr

        coord = client.CoordinationV1Api(api)
        before_kill = coord.read_namespaced_lease(LEASE, namespace)
        killed_at = time.time()
        leader.kill()
        now = wait_for(lambda: (s := status(standby))["leader"] and s["first_sync_at"] and s, timeout=60,
                       interval=0.05, what="the standby taking over")
        # Safety, not speed (bench/leader_takeover.py --component autoscaler measures the takeover time): the standby
        # took the lease only after the dead leader's last renewal had expired. Every write to the Lease since before
        # the kill, replayed from the apiserver in order: the dead leader's last renewTime, then the standby's term.
        records = [before_kill.spec, *lease_records(api, namespace, before_kill.metadata.resource_version,
                                                    until_holder=standby.name)]
        last_renewal = max(r.renew_time for r in records if r.holder_identity == leader.name)
        print(json.dumps({"takeover_s": round(now["acquired_at"] - killed_at, 3),
                          "first_sync_s": round(now["first_sync_at"] - killed_at, 3), "lease_duration_s": LEASE_S,
                          "acquired_after_expiry_s": round(now["acquired_at"] - last_renewal.timestamp() - LEASE_S,
                                                           3)}))
        assert now["acquired_at"] >= last_renewal.timestamp() + LEASE_S, (last_renewal, now)
        assert [r.holder_identity for r in records][-1] == standby.name
        lease = coord.read_namespaced_lease(LEASE, namespace)
        assert lease.spec.holder_identity == standby.name and lease.spec.lease_transitions >= 1

        # the new leader acts: someone scales llm down by hand, it restores min_replicas and says so
        client.AppsV1Api(api).patch_namespaced_deployment_scale("llm", namespace, {"spec": {"replicas": 1}})
        wait_for(lambda: replicas(api, namespace) == 2, timeout=30, what="the new leader restoring min_replicas")
        after = wait_for(lambda: (e := event_instances(api, namespace)) and standby.name in e and e, timeout=30,
                         what="an event of the new leader")
        assert set(after) == {leader.name, standby.name}
    finally:
        a.stop()
        b.stop()
