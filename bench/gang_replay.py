"""Gangs from the Alibaba multi-GPU trace into a KWOK slice of the trace's cluster: all-or-nothing placement by
`gpuaas gangs` against the same pods placed one by one by kube-scheduler, on the same slice, in one invocation
(issue 17).

The slice: `--slice` nodes sampled from `--nodes` with `--seed` (random.Random(seed).sample, as
bench/extender_replay.py samples it: the same seed gives the same slice). The gangs: drawn with
numpy.random.default_rng([seed, 17]) until their GPUs reach `--demand` x the slice's GPUs (or exactly `--gangs`):

  size   `--sizes uniform` (default): uniform on 2..16; `--sizes pow2`: uniform on {2, 4, 8, 16}.
  shape  one pod of the trace's GPU pods (num_gpu > 0), drawn uniformly; every member of the gang asks for exactly
         that (CPU, memory, GPUs, GPU share), as data-parallel workers do. `--no-shares` leaves the trace's GPU-share
         pods (gpu_milli < 1000) out of the draw.

Each run starts a fresh local cluster of the slice (runtime.pools.pools_from_node_specs) with kube-scheduler
configured as in bench/extender_replay.py: the gpuaas profile (in-tree resource scorers off, percentageOfNodesToScore
100) and the shipped extender entries (extender.schedconfig.extender_entries: the GPU pods' filter/prioritize/bind
entry and the ignorable CPU-pods entry), the extender `gpuaas extender --policy gpuaas` beside it. `--no-extender`
runs kube-scheduler's default profile alone instead. The gangs are then created in arrival order, each gang's members
one right after another (as a Job controller creates them), `--gap-s` between gangs, with the scheduler running:

  gangs       members labelled gpuaas.io/gang=<gang>, annotated gpuaas.io/gang-size=<n> and created with the
              scheduling gate gpuaas.io/gang; `gpuaas gangs` (interval 1 s, leader election off) pins and releases
              them whole.
  one_by_one  the same pods without label, annotation or gate: kube-scheduler (+ the extender) places each alone.

A run ends when every pod is bound, or `--quiet-s` seconds after the last creation pass with no new binding (in the
gangs run, also only once the controller has finished two more reconciles with nothing bound meanwhile: a release
decided in a long reconcile is not missed). `--repeat N` runs the pair N times, interleaved (gangs, one_by_one,
gangs, ...), on the same slice and pods.

Printed (one JSON object): per run, the GPU allocation ratio of the slice at the end (all bound pods, and only the
pods of gangs bound whole: what can run), gangs whole / waiting (no member bound) / half-placed (some but not all
members bound: what all-or-nothing prevents; must be 0 for gangs), p50/p90/max of the seconds from a gang's last
member created (client side, when its create returned) to all its members bound (watched) over the gangs bound whole,
for the gangs run also split into deciding (to the release time the controller writes in gpuaas.io/gang-released:
the time of the reconcile that decided it), writing (to the last member's gate seen removed: the pins and gate removals)
and scheduling (to all bound); members bound off their pin, the controller's reconcile time (its /metrics histogram
gpuaas_gangs_reconcile_seconds: count, mean, bucket bounds of p50/p90/p99), released/reset/failed-write counters and
its last decisions (/gangs) by action.

Usage:
  python bench/gang_replay.py --nodes openb_node_list_gpu_node.csv --pods openb_pod_list_multigpu30.csv
      [--slice 200] [--seed 42] [--demand 1.2 | --gangs N] [--sizes uniform|pow2] [--no-shares]
      [--gap-s 0] [--quiet-s 30] [--repeat 1] [--only gangs|one_by_one] [--no-extender]
      [--extender-option queue_planning_min_pods=0] [--gangs-config '{"time_limit_s": 0.5}'] [--dump FILE]
      [--workdir DIR]
"""
from __future__ import annotations

import argparse
import json
import math
import random
import re
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.extender_replay import (
    NAMESPACE,
    PodWatch,
    code_version,
    extender_decisions,
    extender_options,
    kind,
    kind_rank,
    ratio,
)
from scoring.constraints import HOSTNAME_LABEL
from scoring.gangs import GANG_GATE, GANG_LABEL, GANG_SIZE_ANNOTATION, RELEASED_ANNOTATION, gates
from scoring.model import MILLI, ClusterState, PodDemand

MODES = ("gangs", "one_by_one")
SIZE_CHOICES = {"uniform": tuple(range(2, 17)), "pow2": (2, 4, 8, 16)}
RECONCILE_METRIC = "gpuaas_gangs_reconcile_seconds"


# -- pure helpers (tests/bench/test_gang_replay.py) -------------------------------------------------------------------

@dataclass(frozen=True)
class GangSpec:
    name: str
    size: int
    shape: PodDemand  # every member's demand

    @property
    def gpu_milli(self) -> int:
        return self.size * self.shape.total_gpu_milli

    def member_names(self) -> list[str]:
        return [f"{self.name}-{i:02d}" for i in range(self.size)]


def draw_gangs(shapes: Sequence[PodDemand], capacity_milli: int, rng: np.random.Generator, *,
               demand: float = 1.2, gangs: int | None = None, sizes: str = "uniform") -> list[GangSpec]:
    """Gangs in arrival order: each a size from SIZE_CHOICES[sizes] and a shape from `shapes` (GPU pods), both
    uniform. Exactly `gangs` of them, or (gangs None) until their GPUs reach `demand` x `capacity_milli` (the gang
    that crosses it included)."""
    if not shapes:
        raise ValueError("no GPU pod shapes to draw from")
    if any(not s.gpus for s in shapes):
        raise ValueError("gang shapes must ask for a GPU")
    choices = SIZE_CHOICES[sizes]
    out: list[GangSpec] = []
    total = 0
    while (len(out) < gangs) if gangs is not None else (total < demand * capacity_milli):
        size = int(choices[rng.integers(len(choices))])
        shape = shapes[int(rng.integers(len(shapes)))]
        g = GangSpec(f"g{len(out):04d}", size, PodDemand(shape.cpu_milli, shape.memory_mib, shape.gpus,
                                                         shape.gpu_milli, shape.mig_profile, shape.allowed_models))
        out.append(g)
        total += g.gpu_milli
    return out


def member_pod(name: str, namespace: str, gang: GangSpec, *, as_gang: bool) -> dict[str, Any]:
    """One member's Pod; `as_gang`: labelled, annotated and gated as a gpuaas gang member (what the webhook would
    add), else the plain pod of the same shape."""
    from gpuaas.workloads import pod_for_demand

    pod = pod_for_demand(name, namespace, gang.shape)
    pod["metadata"]["labels"]["replay-gang"] = gang.name  # for the accounting only, in both modes
    if as_gang:
        pod["metadata"]["labels"][GANG_LABEL] = gang.name
        pod["metadata"]["annotations"][GANG_SIZE_ANNOTATION] = str(gang.size)
        pod["spec"]["schedulingGates"] = [{"name": GANG_GATE}]
    return pod


def gang_outcomes(sizes: Mapping[str, int], bound: Mapping[str, int]) -> dict[str, int]:
    """Gangs (name -> size) by how many members are bound (name -> count): whole, waiting (none), half_placed
    (some, not all)."""
    out = Counter({"whole": 0, "waiting": 0, "half_placed": 0})
    for g, n in sizes.items():
        b = bound.get(g, 0)
        out["whole" if b >= n else "waiting" if b == 0 else "half_placed"] += 1
    return dict(out)


def spread(values: Sequence[float]) -> dict[str, Any]:
    """n, p50, p90 (nearest rank) and max, rounded to 0.01 s; None for no values."""
    if not values:
        return {"n": 0, "p50": None, "p90": None, "max": None}
    v = sorted(values)

    def rank(q: float) -> float:
        return v[max(0, math.ceil(q * len(v)) - 1)]
    return {"n": len(v), "p50": round(rank(0.5), 2), "p90": round(rank(0.9), 2), "max": round(v[-1], 2)}


def size_bucket(size: int) -> str:
    lo = (size - 1) // 4 * 4 + 1
    return f"{max(2, lo)}-{lo + 3}"


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition: 'name{labels}' -> value (comments skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


def histogram_summary(metrics: Mapping[str, float], name: str) -> dict[str, Any]:
    """count, sum, mean and the bucket bounds under which 50, 90 and 99% of a histogram's observations fell
    ("<= le"; "> last" when beyond the largest finite bucket)."""
    count = metrics.get(f"{name}_count", 0.0)
    total = metrics.get(f"{name}_sum", 0.0)
    buckets = sorted((float(m.group(1)), v) for k, v in metrics.items()
                     if (m := re.fullmatch(rf'{re.escape(name)}_bucket\{{le="([^"]+)"\}}', k)))
    finite = [b for b in buckets if math.isfinite(b[0])]

    def bound(q: float) -> str | None:
        if not count:
            return None
        for le, c in finite:
            if c >= q * count:
                return f"<= {le:g}"
        return f"> {finite[-1][0]:g}" if finite else None
    return {"count": int(count), "sum_s": round(total, 3), "mean_s": round(total / count, 4) if count else None,
            "p50": bound(0.5), "p90": bound(0.9), "p99": bound(0.99),
            "buckets": {f"{le:g}": int(c) for le, c in buckets}}


def pending_reason(pod: Mapping[str, Any]) -> str:
    """Why a pod is not bound, in short: its PodScheduled=False message up to the first '(' or ',' after the node
    count ('0/200 nodes are available: 1 no GPU with 590/1000 free'), 'gated' or 'not tried yet'."""
    if (pod.get("spec") or {}).get("schedulingGates"):
        return "gated"
    for c in (pod.get("status") or {}).get("conditions") or ():
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            msg = str(c.get("message") or c.get("reason") or "?")
            head, _, rest = msg.partition(": ")
            cut = min((i for i in (rest.find(","), rest.find(" (")) if i >= 0), default=len(rest))
            return f"{head}: {rest[:cut]}" if rest else head
    return "not tried yet"


def shape_summary(gangs: Sequence[GangSpec]) -> dict[str, Any]:
    kinds = Counter(kind(g.shape) for g in gangs)
    return {
        "gangs": len(gangs), "pods": sum(g.size for g in gangs),
        "gpu_milli": sum(g.gpu_milli for g in gangs),
        "by_size": {str(s): n for s, n in sorted(Counter(g.size for g in gangs).items())},
        "by_shape_kind": {k: kinds[k] for k in sorted(kinds, key=kind_rank)},
    }


def account(gangs: Sequence[GangSpec], pods: Mapping[str, Mapping[str, Any]], created: Mapping[str, float],
            bound_at: Mapping[str, float], capacity_milli: int, *, epoch_offset: float | None = None,
            ungated: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The run's outcome from the final pods (name -> Pod), client-side creation times and watched bind times (name ->
    seconds on one clock). Gangs run: `epoch_offset` (epoch seconds minus that clock) places the controller's release
    (the gpuaas.io/gang-released annotation: the time of the reconcile that decided it) on that clock, and `ungated`
    (name -> when the watch first saw it without the gate) splits a gang's time into deciding (last member created to
    released), writing (released to the last gate removed: pins and gate removals) and scheduling (last gate removed
    to all bound)."""
    sizes = {g.name: g.size for g in gangs}
    bound_n: Counter[str] = Counter()
    used = whole_used = 0
    latency: list[float] = []
    to_release: list[float] = []
    to_ungated: list[float] = []
    to_bound: list[float] = []
    off_pin = 0
    by_bucket: dict[str, Counter[str]] = {}
    half: list[dict[str, Any]] = []
    for g in gangs:
        names = g.member_names()
        objs = [pods.get(n) for n in names]
        on = [o for o in objs if o is not None and (o.get("spec") or {}).get("nodeName")]
        bound_n[g.name] = len(on)
        used += len(on) * g.shape.total_gpu_milli
        for o in on:
            pin = ((o.get("spec") or {}).get("nodeSelector") or {}).get(HOSTNAME_LABEL)
            off_pin += bool(pin) and pin != o["spec"]["nodeName"]
        state = "whole" if len(on) == g.size else "waiting" if not on else "half_placed"
        by_bucket.setdefault(size_bucket(g.size), Counter())[state] += 1
        if state == "half_placed":
            pending = [o for o in objs if o is not None and not (o.get("spec") or {}).get("nodeName")]
            half.append({"gang": g.name, "size": g.size, "bound": len(on), "shape": kind(g.shape),
                         "pending_reasons": dict(Counter(pending_reason(o) for o in pending))})
        if len(on) != g.size:
            continue
        whole_used += g.gpu_milli
        if all(n in bound_at and n in created for n in names):
            last_created = max(created[n] for n in names)
            done = max(bound_at[n] for n in names)
            latency.append(done - last_created)
            released = [float(a) for o in objs if o is not None
                        if (a := ((o.get("metadata") or {}).get("annotations") or {}).get(RELEASED_ANNOTATION))]
            if epoch_offset is not None and len(released) == g.size:
                rel = max(released) - epoch_offset
                to_release.append(rel - last_created)
                if ungated is not None and all(n in ungated for n in names):
                    last_ungated = max(ungated[n] for n in names)
                    to_ungated.append(last_ungated - rel)
                    to_bound.append(done - last_ungated)
    out: dict[str, Any] = {
        "allocation_ratio": ratio(used, capacity_milli),
        "allocation_ratio_whole_gangs_only": ratio(whole_used, capacity_milli),
        "gangs": gang_outcomes(sizes, bound_n),
        "gangs_by_size": {b: dict(c) for b, c in sorted(by_bucket.items(), key=lambda kv: int(kv[0].split("-")[0]))},
        "half_placed_gpu_milli": sum(bound_n[g.name] * g.shape.total_gpu_milli for g in gangs
                                     if 0 < bound_n[g.name] < g.size),
        "bound_pods": sum(bound_n.values()), "pods": sum(sizes.values()),
        "last_member_created_to_all_bound_s": spread(latency),
        "members_bound_off_their_pin": off_pin,
        "half_placed_detail": half,
    }
    if epoch_offset is not None:
        out["last_member_created_to_released_s"] = spread(to_release)
        out["released_to_last_gate_removed_s"] = spread(to_ungated)
        out["last_gate_removed_to_all_bound_s"] = spread(to_bound)
    return out


# -- the cluster side -------------------------------------------------------------------------------------------------

def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def get_metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        return parse_metrics(resp.read().decode())


class GangWatch(PodWatch):
    """PodWatch that also records when each gang member was first seen without the gang gate."""

    def __init__(self, core: Any, demand_of: dict[str, PodDemand], t0: float) -> None:
        super().__init__(core, demand_of, t0)
        self.ungated: dict[str, float] = {}

    def _see(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if name not in self.ungated and GANG_LABEL in (pod["metadata"].get("labels") or {}) \
                and GANG_GATE not in gates(pod):
            with self.cond:
                self.ungated[name] = time.monotonic() - self.t0
        super()._see(pod)


def wait_end(watcher: PodWatch, total: int, quiet_s: float, deadline: float, since: float,
             controller_url: str | None) -> str:
    """PodWatch.quiet, and with a controller: also two reconciles finished after the quiet period began with nothing
    bound meanwhile."""
    while True:
        end = watcher.quiet(total, quiet_s, deadline, since)
        if end != "quiet" or controller_url is None:
            return end
        with watcher.cond:
            binds = len(watcher.bound)
        start = get_metrics(controller_url).get(f"{RECONCILE_METRIC}_count", 0.0)
        while get_metrics(controller_url).get(f"{RECONCILE_METRIC}_count", 0.0) < start + 2:
            if time.monotonic() >= deadline:
                return "timeout"
            time.sleep(0.5)
        with watcher.cond:
            if len(watcher.bound) == binds:
                return "quiet"
            since = watcher.last_bind


def run_once(mode: str, rep: int, args: argparse.Namespace, spec: Any, gangs: Sequence[GangSpec],
             capacity: int) -> dict[str, Any]:
    import yaml
    from kubernetes import client

    from extender.schedconfig import extender_entries, gpuaas_profile
    from gpuaas.cluster.components import extender_process, gangs_process
    from gpuaas.cluster.local import LocalCluster
    from gpuaas.cluster.process import free_port

    as_gang = mode == "gangs"
    demand_of = {n: g.shape for g in gangs for n in g.member_names()}
    total = len(demand_of)
    timings: dict[str, float] = {}
    out: dict[str, Any] = {"mode": mode, "repeat": rep}
    with tempfile.TemporaryDirectory(prefix=f"gpuaas-gang-replay-{mode}-") as tmp:
        workdir = args.workdir / f"{mode}-{rep}" if args.workdir else Path(tmp)
        port = free_port()
        if args.no_extender:
            cluster = LocalCluster(workdir, name=f"gang-{mode}")
            ext = None
        else:
            cluster = LocalCluster(workdir, name=f"gang-{mode}", extenders=extender_entries(f"http://127.0.0.1:{port}"),
                                   scheduler_profiles=[gpuaas_profile("default-scheduler")])
            extra: list[str] = []
            if args.extender_option:
                Path(workdir).mkdir(parents=True, exist_ok=True)
                path = Path(workdir) / "replay-extender.json"
                path.write_text(json.dumps(extender_options(args.extender_option)))
                extra = ["--config", str(path)]
            ext = extender_process(workdir, cluster.kubeconfig, policy="gpuaas", port=port, extra=extra)
        ctl = None
        if as_gang:
            config = Path(workdir) / "gangs.yaml"
            Path(workdir).mkdir(parents=True, exist_ok=True)
            config.write_text(yaml.safe_dump({"interval_s": 1, "leader_election": {"enabled": False},
                                              **json.loads(args.gangs_config)}))
            ctl = gangs_process(workdir, cluster.kubeconfig, config)
        watcher: GangWatch | None = None
        created: dict[str, float] = {}
        offsets: list[float] = []  # epoch minus the watch's clock, per creation
        try:
            t = time.monotonic()
            cluster.up(spec, timeout=300)
            if ext is not None:
                ext.start(timeout=60)
            if ctl is not None:
                ctl.start(timeout=60)
            timings["cluster_up_s"] = time.monotonic() - t
            core = client.CoreV1Api(cluster.api)
            core.create_namespace({"metadata": {"name": NAMESPACE}})
            t0 = time.monotonic()
            watcher = GangWatch(core, demand_of, t0)
            watcher.start()
            t0 = watcher.t0 = time.monotonic()  # the list took a moment; bind times count from the first create
            for g in gangs:
                for name in g.member_names():
                    core.create_namespaced_pod(NAMESPACE, member_pod(name, NAMESPACE, g, as_gang=as_gang),
                                               _preload_content=False)
                    created[name] = time.monotonic() - t0
                    offsets.append(time.time() - created[name])
                if args.gap_s:
                    time.sleep(args.gap_s)
            timings["create_s"] = time.monotonic() - t0
            end = wait_end(watcher, total, args.quiet_s, time.monotonic() + args.timeout, time.monotonic(),
                           ctl.url if ctl is not None else None)
            timings["run_s"] = time.monotonic() - t0
            with watcher.cond:
                bound_at = dict(watcher.bound)
                ungated = dict(watcher.ungated)
                timings["last_bind_s"] = watcher.last_bind - t0
            watcher.stop()
            objs = json.loads(core.list_namespaced_pod(NAMESPACE, _preload_content=False).data)["items"]
            if ext is not None:
                out["extender_decisions"] = extender_decisions(ext.url)
            if ctl is not None:
                metrics = get_metrics(ctl.url)
                decisions = get_json(f"{ctl.url}/gangs")
                out["controller"] = {
                    "reconcile_seconds": histogram_summary(metrics, RECONCILE_METRIC),
                    "released_total": int(metrics.get("gpuaas_gangs_released_total", 0)),
                    "reset_total": int(metrics.get("gpuaas_gangs_reset_total", 0)),
                    "failed_writes_total": int(metrics.get("gpuaas_gangs_failed_writes_total", 0)),
                    "waiting": int(metrics.get("gpuaas_gangs_waiting", 0)),
                    "last_decisions_by_action": dict(Counter(d["action"] for d in decisions.values())),
                    "example_wait_messages": sorted({d["message"] for d in decisions.values()
                                                     if d["action"] == "wait"})[:3],
                }
                log = ctl.log.read_text(errors="replace") if ctl.log.exists() else ""
                out["controller"]["log_errors"] = [ln[:300] for ln in log.splitlines()
                                                   if '"ERROR"' in ln or "Traceback" in ln][:5]
            if args.dump:
                path = args.dump.with_name(f"{args.dump.stem}-{mode}-{rep}{args.dump.suffix}")
                path.write_text(json.dumps({"pods": objs, "bind_seconds": bound_at, "created_seconds": created}))
        finally:
            if watcher is not None:
                watcher.stop()
            if ctl is not None:
                ctl.stop()
            if ext is not None:
                ext.stop()
            cluster.down()
    by_name = {p["metadata"]["name"]: p for p in objs}
    out.update(account(gangs, by_name, created, bound_at, capacity,
                       epoch_offset=float(np.median(offsets)) if as_gang else None, ungated=ungated))
    out["end"] = end
    out["watch_errors"] = watcher.errors[:5] if watcher else []
    out["timings"] = {k: round(v, 1) for k, v in timings.items()}
    return out


def summary(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per mode, the runs' headline numbers side by side."""
    out: dict[str, Any] = {}
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        if not mine:
            continue
        out[mode] = {
            "allocation_ratio": [r["allocation_ratio"] for r in mine],
            "allocation_ratio_whole_gangs_only": [r["allocation_ratio_whole_gangs_only"] for r in mine],
            "gangs_whole_waiting_half_placed": [[r["gangs"][k] for k in ("whole", "waiting", "half_placed")]
                                                for r in mine],
            "last_member_created_to_all_bound_s_p50_p90_max": [
                [r["last_member_created_to_all_bound_s"][k] for k in ("p50", "p90", "max")] for r in mine],
        }
        if mode == "gangs":
            out[mode]["reconcile_mean_s"] = [r.get("controller", {}).get("reconcile_seconds", {}).get("mean_s")
                                             for r in mine]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", required=True, help="openb_node_list_gpu_node.csv")
    parser.add_argument("--pods", required=True, help="a multi-GPU trace, e.g. openb_pod_list_multigpu30.csv")
    parser.add_argument("--slice", type=int, default=200, help="nodes sampled from the cluster")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--demand", type=float, default=1.2, help="gangs' GPUs as a fraction of the slice's")
    parser.add_argument("--gangs", type=int, help="exactly this many gangs (instead of --demand)")
    parser.add_argument("--sizes", choices=sorted(SIZE_CHOICES), default="uniform",
                        help="gang sizes: uniform on 2..16, or uniform on {2,4,8,16}")
    parser.add_argument("--no-shares", action="store_true", help="leave GPU-share pods out of the shapes")
    parser.add_argument("--gap-s", type=float, default=0.0, help="pause between two gangs' creations")
    parser.add_argument("--quiet-s", type=float, default=30.0,
                        help="a run ends after this long without a new binding (or when every pod is bound)")
    parser.add_argument("--timeout", type=float, default=1800, help="give up waiting for a run's end after this long")
    parser.add_argument("--repeat", type=int, default=1, help="run the pair this many times, interleaved")
    parser.add_argument("--only", choices=MODES, help="run only this mode")
    parser.add_argument("--no-extender", action="store_true",
                        help="kube-scheduler's default profile alone, no gpuaas extender")
    parser.add_argument("--extender-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an extender setting (extender.config.ExtenderConfig), e.g. queue_planning_min_pods=0 "
                             "(joint planning of the queue off); repeatable")
    parser.add_argument("--gangs-config", default="{}",
                        help="JSON merged into gpuaas gangs' config (e.g. '{\"time_limit_s\": 0.5}')")
    parser.add_argument("--dump", type=Path, help="write each run's final Pods and times to FILE-<mode>-<repeat>")
    parser.add_argument("--workdir", type=Path, help="keep the clusters' logs here (default: temporary folders)")
    args = parser.parse_args()

    from gpuaas.simulate.traces import load_nodes, load_pods
    from runtime.pools import pools_from_node_specs

    started = time.monotonic()
    version = code_version()  # extender, scoring, runtime, gpuaas/cluster; the controller's files too:
    import subprocess
    gangs_changed = subprocess.run(["git", "status", "--porcelain", "--", "gangs"], capture_output=True, text=True,
                                   cwd=Path(__file__).resolve().parents[1], timeout=10).stdout
    version["uncommitted"] += [ln[3:] for ln in gangs_changed.splitlines()]
    nodes = random.Random(args.seed).sample(load_nodes(args.nodes), args.slice)
    spec = pools_from_node_specs(nodes)
    capacity = ClusterState(nodes).total_gpu_milli
    shapes = [p for p in load_pods(args.pods) if p.gpus and not (args.no_shares and p.is_share)]
    gangs = draw_gangs(shapes, capacity, np.random.default_rng([args.seed, 17]), demand=args.demand,
                       gangs=args.gangs, sizes=args.sizes)
    order = [m for _ in range(args.repeat) for m in MODES if args.only in (None, m)]
    runs = []
    for i, mode in enumerate(order):
        runs.append(run_once(mode, i // (1 if args.only else len(MODES)), args, spec, gangs, capacity))
    drawn = shape_summary(gangs)
    print(json.dumps({
        "bench": "gang_replay",
        "inputs": {"nodes": Path(args.nodes).name, "pods": Path(args.pods).name, "slice_nodes": args.slice,
                   "seed": args.seed, "demand": None if args.gangs else args.demand, "gangs": args.gangs,
                   "sizes": args.sizes, "no_shares": args.no_shares, "gap_s": args.gap_s, "quiet_s": args.quiet_s,
                   "extender": not args.no_extender, "extender_options": extender_options(args.extender_option),
                   "gangs_config": json.loads(args.gangs_config),
                   "repeat": args.repeat, "order": order},
        "code": version,
        "slice_gpus": capacity // MILLI,
        "drawn": {**drawn, "gpu_demand_ratio": ratio(drawn["gpu_milli"], capacity)},
        "summary": summary(runs),
        "runs": runs,
        "total_s": round(time.monotonic() - started, 1),
    }, indent=2))


if __name__ == "__main__":
    main()
