"""Leader takeover after SIGKILL: two replicas of `gpuaas nodescaler` (or `gpuaas autoscaler`) behind one Lease in a
local KWOK cluster; the leader is killed N times at random points of its renew period, and the time from the SIGKILL
to the standby's lease acquisition (the acquiring write returned) and to its first reconcile/sync as leader is
printed as JSON. Both times come from the replicas' /leader endpoint (wall clock of the same machine).

    python bench/leader_takeover.py [--component nodescaler|autoscaler] [--kills 12] [--lease-rbac watch|poll]

Timings: lease 4 s, renew deadline 3 s, retry period 0.5 s (the end-to-end tests' setting). The replicas run with a
ServiceAccount: the nodescaler with deploy/bases/nodescaler (its RBAC), the autoscaler with the rules its end-to-end
test grants. `--lease-rbac watch` adds list and watch on the Lease (the standby sees each renewal as it happens);
`poll` leaves them out (the standby reads the Lease every retry period).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml
from kubernetes import client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuaas.cluster.components import ComponentProcess
from gpuaas.cluster.local import LocalCluster
from gpuaas.cluster.prometheus import PrometheusServer
from gpuaas.workloads import gpu_deployment
from runtime.pools import parse_pool_spec
from tests.e2e.kube import lease_rules, rbac_manifest
from tests.e2e.test_autoscaler_leader import AUTOSCALER_RULES

REPO = Path(__file__).resolve().parents[1]
A100X8 = {"gpu": {"model": "A100-80GB", "count": 8}, "cpu": "128", "memory": "1Ti"}
TIMINGS = {"lease_duration_s": 4, "renew_deadline_s": 3, "retry_period_s": 0.5}
NS = "gpuaas-system"  # deploy/bases/nodescaler binds its ServiceAccount there


def status(proc: ComponentProcess) -> dict:
    with urllib.request.urlopen(f"{proc.url}/leader", timeout=5) as resp:
        return json.loads(resp.read())


def summary(values: list[float]) -> dict:
    return {"min": round(min(values), 3), "median": round(statistics.median(values), 3),
            "max": round(max(values), 3), "values": [round(v, 3) for v in values]}


class Replicas:
    """Starts replicas of one component with fresh identities (a restarted pod gets a new one)."""

    def __init__(self, component: str, workdir: Path, kubeconfig: Path, config: Path):
        self.component, self.workdir, self.kubeconfig, self.config = component, workdir, kubeconfig, config
        self.started = 0

    def start(self) -> ComponentProcess:
        self.started += 1
        name = f"{self.component}-{self.started}"
        proc = ComponentProcess(name, [], self.workdir)
        proc.args = [self.component, "--config", str(self.config), "--kubeconfig", str(self.kubeconfig),
                     "--host", "127.0.0.1", "--port", str(proc.port), "--identity", name]
        return proc.start(timeout=120)


def setup(component: str, cluster: LocalCluster, workdir: Path,
          lease_rbac: str) -> tuple[Path, Path, PrometheusServer | None]:
    """(kubeconfig, config file, Prometheus or None) for the component."""
    lease_name = f"gpuaas-{component}"
    lease = lease_rules(lease_name, watch=lease_rbac == "watch")
    prometheus = None
    if component == "nodescaler":
        kubeconfig = cluster.service_account_kubeconfig(REPO / "deploy" / "bases" / "nodescaler",
                                                        "gpuaas-nodescaler", namespace=NS)
        if lease_rbac == "watch":  # on top of the shipped Role (get, update, create)
            extra = workdir / "lease-watch.yaml"
            extra.write_text(rbac_manifest("gpuaas-nodescaler", NS, namespace_rules=lease))
            cluster.control_plane.kubectl("apply", "-n", NS, "-f", str(extra))
        config = {"interval_s": 1, "scale_in": {"enabled": False},
                  "groups": [{"name": "a100x8", "template": A100X8, "max_size": 4, "cost_per_hour": 20}],
                  "leader_election": {"namespace": NS, "name": lease_name, **TIMINGS}}
    else:
        rbac = workdir / "autoscaler-rbac.yaml"
        rbac.write_text(rbac_manifest("gpuaas-autoscaler", NS, cluster_rules=AUTOSCALER_RULES, namespace_rules=lease))
        kubeconfig = cluster.service_account_kubeconfig(rbac, "gpuaas-autoscaler", namespace=NS)
        prometheus = PrometheusServer(workdir / "prometheus", targets=[], scrape_interval="1s").start()
        client.AppsV1Api(cluster.api).create_namespaced_deployment(NS, gpu_deployment("llm", NS, gpus=1))
        config = {"prometheus": {"url": prometheus.url, "timeout_s": 2}, "interval_s": 1,
                  "leader_election": {"namespace": NS, **TIMINGS},
                  "targets": [{"deployment": "llm", "namespace": NS, "min_replicas": 1, "max_replicas": 2}]}
    path = workdir / f"{component}.yaml"
    path.write_text(yaml.safe_dump(config))
    return kubeconfig, path, prometheus


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--component", choices=("nodescaler", "autoscaler"), default="nodescaler")
    ap.add_argument("--kills", type=int, default=12)
    ap.add_argument("--lease-rbac", choices=("watch", "poll"), default="watch")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="takeover-bench-"))
    cluster = LocalCluster(workdir, name="takeover")
    procs: list[ComponentProcess] = []
    prometheus: PrometheusServer | None = None
    out: dict = {"component": args.component, "lease_rbac": args.lease_rbac, **TIMINGS, "kills": args.kills}
    try:
        cluster.up(parse_pool_spec({"pools": [{"name": "base", "count": 1, **A100X8}]}), timeout=300)
        client.CoreV1Api(cluster.api).create_namespace({"metadata": {"name": NS}})
        kubeconfig, config, prometheus = setup(args.component, cluster, workdir, args.lease_rbac)
        replicas = Replicas(args.component, workdir, kubeconfig, config)
        procs = [replicas.start(), replicas.start()]
        takeovers, first_actions = [], []
        for _ in range(args.kills):
            deadline = time.monotonic() + 30
            while not (leaders := [p for p in procs if status(p)["leader"]]):
                if time.monotonic() > deadline:
                    raise TimeoutError("no leader")
                time.sleep(0.05)
            leader = leaders[0]
            standby = next(p for p in procs if p is not leader)
            time.sleep(rng.uniform(1.5, 2.5))  # the standby has seen the Lease; the kill lands anywhere in a period
            killed_at = time.time()
            leader.kill()
            deadline = time.monotonic() + 30
            while True:
                s = status(standby)
                first = s.get("first_reconcile_at") or s.get("first_sync_at")
                if s["leader"] and first:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{standby.name} did not take over: {s}")
                time.sleep(0.02)
            takeovers.append(s["acquired_at"] - killed_at)
            first_actions.append(first - killed_at)
            print(f"kill {len(takeovers)}: takeover {takeovers[-1]:.3f}s, first action {first_actions[-1]:.3f}s",
                  file=sys.stderr)
            procs = [standby, replicas.start()]
        out["takeover_s"] = summary(takeovers)
        out["first_action_s"] = summary(first_actions)
        out["takeovers_within_lease"] = sum(1 for t in takeovers if t <= TIMINGS["lease_duration_s"])
        # The target the end-to-end tests no longer assert (they check order: only the Lease's holder acts): with the
        # Lease polled, takeover within the lease plus one retry period.
        target = TIMINGS["lease_duration_s"] + TIMINGS["retry_period_s"]
        out["takeover_target_s"] = target
        out["takeovers_within_target"] = sum(1 for t in takeovers if t <= target)
    finally:
        for p in procs:
            p.stop()
        if prometheus is not None:
            prometheus.stop()
        cluster.down()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
