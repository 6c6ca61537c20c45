"""How late kwok completes a pod annotated to finish after a delay (`gpu_pod(..., complete_after="5s")`), in a local
KWOK cluster. The end-to-end test asserts only that completion is not early; this measures how late it is.

    python bench/kwok_completion.py [--pods 20] [--delay-s 5]

Creates --pods annotated pods at once and prints JSON: per pod, the time from its Ready condition to its
finishedAt (kwok's own timestamps, one-second resolution) and from the moment the pod was seen Ready to the moment
it was seen Succeeded (this process's watch, sub-second; below the delay when the Ready update reached the watch
late), then their median, maximum and how far the maximum is past the delay.

Measured (20 pods, 5 s, 2-core machine under other load): kwok 5.0 s for every pod (0 s late); seen 4.65 s median,
4.91 s max.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kubernetes import client, watch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuaas.cluster.local import LocalCluster
from gpuaas.workloads import gpu_pod
from runtime.pools import parse_pool_spec

POOLS = {"pools": [{"name": "a100", "count": 4, "gpu": {"model": "A100-80GB", "count": 8}, "cpu": "128",
                    "memory": "1Ti"}]}


def is_ready(pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def run(api, pods: int, delay_s: float, timeout_s: float) -> list[dict]:
    core = client.CoreV1Api(api)
    ns = "kwok-completion"
    core.create_namespace({"metadata": {"name": ns}})
    rv = core.list_namespaced_pod(ns).metadata.resource_version
    for i in range(pods):
        core.create_namespaced_pod(ns, gpu_pod(f"job-{i}", ns, gpus=1, complete_after=f"{delay_s:g}s"))
    ready_seen: dict[str, float] = {}
    done: dict[str, dict] = {}
    deadline = time.monotonic() + timeout_s
    w = watch.Watch()
    while len(done) < pods and time.monotonic() < deadline:
        for ev in w.stream(core.list_namespaced_pod, ns, resource_version=rv, timeout_seconds=10):
            pod = ev["object"]
            rv = pod.metadata.resource_version
            name, now = pod.metadata.name, time.monotonic()
            if is_ready(pod) and pod.status.phase == "Running":
                ready_seen.setdefault(name, now)
            if pod.status.phase == "Succeeded" and name not in done:
                term = pod.status.container_statuses[0].state.terminated
                ready = next(c for c in pod.status.conditions if c.type == "Ready")
                kwok_s = (term.finished_at - ready.last_transition_time).total_seconds()
                done[name] = {"pod": name, "kwok_ready_to_finished_s": kwok_s,
                              "seen_ready_to_succeeded_s": round(now - ready_seen.get(name, now), 3)}
            if len(done) == pods or time.monotonic() >= deadline:
                w.stop()
                break
    core.delete_namespace(ns)
    return sorted(done.values(), key=lambda r: int(r["pod"].split("-")[1]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pods", type=int, default=20)
    ap.add_argument("--delay-s", type=float, default=5.0)
    ap.add_argument("--timeout-s", type=float, default=120.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuaas-bench-") as tmp:
        cluster = LocalCluster(Path(tmp) / "cluster", name="kwok-completion")
        try:
            cluster.up(parse_pool_spec(POOLS), timeout=300)
            rows = run(cluster.api, args.pods, args.delay_s, args.timeout_s)
        finally:
            cluster.down()
    for row in rows:
        print(json.dumps(row))
    summary = {"bench": "kwok_completion", "delay_s": args.delay_s, "pods": args.pods, "completed": len(rows)}
    for key in ("kwok_ready_to_finished_s", "seen_ready_to_succeeded_s"):
        values = [r[key] for r in rows]
        if values:
            summary[f"{key}_median"] = round(statistics.median(values), 3)
            summary[f"{key}_max"] = round(max(values), 3)
            summary[f"{key}_late_max"] = round(max(values) - args.delay_s, 3)
    print(json.dumps(summary))
    return 0 if len(rows) == args.pods else 1


if __name__ == "__main__":
    sys.exit(main())
