"""kube-scheduler's throughput on a KWOK cluster with the gpuaas extender, as a ratio to the same scheduler profile
without it, and what each component spends per pod.

Every run, in one invocation: a fresh cluster of N 8-GPU nodes; kube-scheduler is stopped, P GPU pods (1, 2 or 4
GPUs) are created, the scheduler is started and the clock runs until every pod is bound. Pods per second = P / that
time. Three configurations:
  default        kube-scheduler's default profile (its adaptive sample of nodes), no extender
  same_profile   the gpuaas profile (extender.schedconfig.gpuaas_profile: every node scored, the in-tree resource
                 scorers off) without the extender
  extender       the gpuaas profile calling the extender (filter, prioritize, bind), as deploy/ configures it
and, asked for with `--configs` (e.g. `default,same_profile,extender,floor,floor_watching,floor_bare,extender_bare`):
  floor          the gpuaas profile calling bench/floor_extender.py as its binder: filter answers the first
                 candidate alone, bind makes the Binding, nothing is decided (what the protocol itself costs here)
  floor_watching the floor also keeping the extender's two watches (nodes and pods, JSON, decoded and stored, no
                 model): what the watches cost the apiserver and the extender
  floor_bare     the floor with its verbs on bench/bare_http.py's bare server instead of aiohttp's: what aiohttp's
                 server costs
  extender_bare  gpuaas's extender with its verbs on that bare server (bench/bare_extender.py): what a leaner
                 server would give gpuaas, all else the same
`--repeats R` runs the three R times, interleaved (round r starts at configuration r mod 3, so none always runs first
on a machine whose load drifts); pods/s and CPU per pod are the median over the rounds, the ratios are the median of
the rounds' own ratios (each from runs next to each other) with their range.

CPU per pod of each component: its user + system CPU from the scheduler's start until every pod is bound and Running
(kwok's status patches included), over P.
`idle_cpu_per_s`: each component's CPU per second in a quiet window before the scheduler starts (node lease renewals,
the extender's watches), and kube-scheduler's in one after the run, every pod bound, so that what a longer run costs
just by lasting longer can be told apart (`cpu_ms_per_pod_above_idle`). For the extender also: its time per verb and
in joint queue planning (its /metrics), and the connections kube-scheduler opened and closed (sockets in TIME-WAIT, by
the side that closed).
`--extender-cpu N`: the extender (gpuaas's or a floor) alone on CPU N and every other component on the remaining
CPUs, as deployed with cores of its own; the same profile then runs on those remaining CPUs alone.
`--cpu-split`: also where the extender's CPU went per pod (bench/cpu_split/sitecustomize.py, thread CPU time around
filter, its queue planning, bind's renew, request validation, reply encoding, watch decoding and handling, log lines
and garbage collection; `other` is the rest: HTTP server and client, event loop, bind's bookkeeping).
Prints JSON.
Usage: python bench/scheduler_throughput.py [--nodes 1000] [--pods 3000] [--repeats 3]
       python bench/scheduler_throughput.py --configs default,same_profile,extender,floor
       python bench/scheduler_throughput.py --configs extender --repeats 1 --cpu-split
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client

from bench.extender_latency import wait_listening
from extender.config import ENV_PREFIX
from extender.schedconfig import extender_entries, gpuaas_profile
from gpuaas.cluster.components import REPO, ComponentProcess, extender_process
from gpuaas.cluster.local import LocalCluster
from gpuaas.cluster.process import free_port
from gpuaas.workloads import gpu_pod
from runtime.pools import parse_pool_spec


def pools(nodes: int) -> dict:
    half = nodes // 2
    return {"pools": [
        {"name": "a100", "count": half, "gpu": {"model": "A100-80GB", "count": 8}, "cpu": "128", "memory": "1Ti"},
        {"name": "h100", "count": nodes - half, "gpu": {"model": "H100-80GB", "count": 8}, "cpu": "128",
         "memory": "1Ti"},
    ]}


def unbound(core: client.CoreV1Api, namespace: str) -> int:
    resp = core.list_namespaced_pod(namespace, field_selector="spec.nodeName=", _preload_content=False)
    return len(json.loads(resp.data)["items"])


def not_running(core: client.CoreV1Api, namespace: str) -> int:
    resp = core.list_namespaced_pod(namespace, field_selector="status.phase!=Running", _preload_content=False)
    return len(json.loads(resp.data)["items"])


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used so far (what each component costs during the run)."""
    return sum(cpu_user_system(pid))


def cpu_user_system(pid: int) -> tuple[float, float]:
    """User and system CPU a process has used so far: system time is the kernel's work in its calls (on loopback a
    write also runs the receiving side's TCP)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / os.sysconf("SC_CLK_TCK"), int(fields[12]) / os.sysconf("SC_CLK_TCK")


SECONDS = "seconds:"  # apiserver_requests' keys for the time the apiserver took answering (in us), by the same labels


def metric_labels(line: str) -> dict[str, str]:
    """A Prometheus text line's labels, values still quoted."""
    return dict(kv.split("=", 1) for kv in line[line.index("{") + 1:line.index("}")].split(","))


def apiserver_metrics(cluster: LocalCluster) -> str:
    """The apiserver's /metrics, in Prometheus text format."""
    return cluster.control_plane.kubectl("get", "--raw", "/metrics").stdout


def apiserver_requests(text: str) -> Counter:
    """apiserver_request_total by verb/resource/subresource (`text`: apiserver_metrics): where the apiserver's time
    goes; and, under SECONDS + the same key, the microseconds it took answering them
    (apiserver_request_duration_seconds_sum)."""
    out: Counter[str] = Counter()
    for line in text.splitlines():
        for metric, prefix in (("apiserver_request_total{", ""), ("apiserver_request_duration_seconds_sum{", SECONDS)):
            if line.startswith(metric):
                labels = metric_labels(line)
                key = "/".join(v.strip('"') for v in (labels.get("verb", ""), labels.get("resource", ""),
                                                     labels.get("subresource", "")) if v.strip('"'))
                value = float(line.rsplit(" ", 1)[1])
                out[prefix + key] += int(value * 1e6) if prefix else int(value)  # microseconds; requests are whole
    return out


WATCHED = ("nodes", "pods", "resourceclaims", "resourceslices")  # what the extender watches (extender/server.py)


def apiserver_watches(text: str) -> dict[str, int]:
    """The watches open on the apiserver (`text`: apiserver_metrics), of the resources the extender watches
    (apiserver_longrunning_requests, verb WATCH, any client's): how many watchers each change is sent to."""
    out: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith("apiserver_longrunning_requests{") and 'verb="WATCH"' in line:
            labels = metric_labels(line)
            out[labels.get("resource", "").strip('"')] += int(float(line.rsplit(" ", 1)[1]))
    return {k: out[k] for k in WATCHED}


def pin(pid: int, cpus: set[int]) -> None:
    """Move a process, every thread it has (those it starts later inherit it), to `cpus`."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), cpus)


def extender_seconds(url: str) -> dict[str, float]:
    """Seconds the extender spent per verb and in queue planning, and requests per verb (its /metrics)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        for metric, what in (("gpuaas_extender_request_duration_seconds_sum", "s"),
                             ("gpuaas_extender_request_duration_seconds_count", "calls"),
                             ("gpuaas_extender_queue_plan_seconds_sum", "s"),
                             ("gpuaas_extender_queue_plan_seconds_count", "calls")):
            if line.startswith(metric):
                verb = line.split('verb="', 1)[1].split('"', 1)[0] if 'verb="' in line else "queue-plan"
                key = f"{verb}_{what}"
                out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def time_wait(port: int) -> dict[str, int]:
    """TCP sockets in TIME-WAIT on loopback to or from `port`: a connection to the extender that was closed, by the
    side that closed it (TIME-WAIT lasts 60 s on Linux, longer than the runs here)."""
    closed = {"closed_by_client": 0, "closed_by_extender": 0}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "06":  # TIME_WAIT
                continue
            local, remote = int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)
            if remote == port:
                closed["closed_by_client"] += 1
            elif local == port:
                closed["closed_by_extender"] += 1
    return closed


CONFIGS = ("default", "same_profile", "extender")
# The same profile against bench/floor_extender.py as a binder: filter answers the first candidate alone, bind makes the
# Binding, nothing is decided. What the extender protocol costs here, whoever implements it (--configs ...,floor).
FLOOR = "floor"
FLOOR_WATCHING = "floor_watching"  # the floor with the extender's watches, nothing decided with them (--watch)
FLOOR_BARE = "floor_bare"  # the floor on bench/bare_http.py's server instead of aiohttp's (--server bare)
FLOORS = (FLOOR, FLOOR_WATCHING, FLOOR_BARE)
# gpuaas's extender with its verbs on bench/bare_http.py's server (bench/bare_extender.py): what a leaner server
# than aiohttp's would give gpuaas, all else the same.
EXTENDER_BARE = "extender_bare"
GPUAAS = ("extender", EXTENDER_BARE)  # the configurations that run gpuaas's extender


class BareExtenderProcess(ComponentProcess):
    """bench/bare_extender.py in place of `gpuaas extender`, with the same arguments and settings."""

    def command(self) -> list[str]:
        return [sys.executable, str(Path(__file__).with_name("bare_extender.py")), *self.args[1:]]  # (args[0]: verb)


def gpuaas_extender(config: str, workdir: Path, kubeconfig: Path, port: int, env: dict[str, str]) -> ComponentProcess:
    ext = extender_process(workdir, kubeconfig, port=port, env=env)
    if config == EXTENDER_BARE:
        return BareExtenderProcess(ext.name, ext.args, workdir, port=ext.port, env=ext.env)
    return ext


def one_run(nodes: int, pods: int, seed: int, config: str, timeout: float,
            sample_percent: int | None = None, *, cpu_entry: bool = False, all_pods: bool = False,
            cpu_share: float = 0.0, idle_s: float = 5.0, extender_options: list[str] | None = None,
            cpu_split: bool = False, extender_cpu: int | None = None) -> dict:
    """`config`: one of CONFIGS. `cpu_entry`: with the CPU-pod entry as deploy/ ships it
    (extender.schedconfig.cpu_pods_entry) beside the GPU pods' entry. `all_pods`: every pod through the GPU entry's
    filter, prioritize and bind instead (the other scheme). `cpu_share`: this fraction of the pods asks for no GPU
    (2 cores, 4Gi). `extender_options`: KEY=VALUE settings of the extender, passed in its environment. `cpu_split`:
    where the extender's CPU went (bench/cpu_split), in ms per pod. `extender_cpu`: the CPU the extender process is
    moved to once started (main() keeps this process and so every other component off it)."""
    with_extender = config in (*GPUAAS, *FLOORS)
    with tempfile.TemporaryDirectory(prefix="gpuaas-tput-") as tmp:
        workdir = Path(tmp)
        port = free_port()
        extenders = (extender_entries(f"http://127.0.0.1:{port}", cpu_pods=cpu_entry, all_pods=all_pods)
                     if with_extender else None)
        profiles = None
        if config != "default" or sample_percent is not None:
            profile: dict[str, Any] = (gpuaas_profile("default-scheduler", all_pods=all_pods) if config != "default"
                                       else {"schedulerName": "default-scheduler"})
            if sample_percent is not None:  # 0: kube-scheduler's adaptive default sample
                profile["percentageOfNodesToScore"] = sample_percent
            profiles = [profile]
        cluster = LocalCluster(workdir, name="tput", extenders=extenders, scheduler_profiles=profiles)
        env = {f"{ENV_PREFIX}{k.upper()}": v for k, v in (o.split("=", 1) for o in extender_options or [])}
        split_file = workdir / "cpu-split.json"
        if cpu_split:
            env[CPU_SPLIT_ENV] = str(split_file)
        ext = gpuaas_extender(config, workdir, cluster.kubeconfig, port, env) if config in GPUAAS else None
        floor: subprocess.Popen | None = None
        try:
            cluster.up(parse_pool_spec(pools(nodes)), timeout=300)
            if ext:
                ext.start(timeout=60)
            if config in FLOORS:
                floor = subprocess.Popen([sys.executable, str(Path(__file__).with_name("floor_extender.py")),
                                          "--port", str(port), "--kubeconfig", str(cluster.kubeconfig),
                                          *(["--watch"] if config == FLOOR_WATCHING else []),
                                          *(["--server", "bare"] if config == FLOOR_BARE else [])],
                                         stdout=(workdir / "floor.log").open("wb"), stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONPATH": str(REPO)})
                wait_listening(port, floor)
            extender_pid = ext.popen.pid if ext and ext.popen else floor.pid if floor else None
            if extender_cpu is not None and extender_pid is not None:
                pin(extender_pid, {extender_cpu})
            core = client.CoreV1Api(cluster.api)
            core.create_namespace({"metadata": {"name": "tput"}})
            cluster.control_plane.stop_scheduler()
            rng = random.Random(seed)
            sizes = [rng.choice((1, 1, 2, 4)) for _ in range(pods)]
            sizes = [0 if rng.random() < cpu_share else g for g in sizes]  # 0: a CPU-only pod

            def make(i: int) -> object:
                body = (gpu_pod(f"p{i:05d}", "tput", gpus=sizes[i], cpu="1", memory="1Gi") if sizes[i]
                        else gpu_pod(f"p{i:05d}", "tput", cpu="2", memory="4Gi"))
                return core.create_namespaced_pod("tput", body, _preload_content=False)

            with ThreadPoolExecutor(16) as ex:
                list(ex.map(make, range(pods)))
            state = cluster.control_plane.state
            assert state is not None, "up() sets it"
            procs = {name: comp.pid for name, comp in state.components.items()
                     if name != "kube-scheduler"}  # (the scheduler gets a new pid when it starts)
            if ext:
                assert ext.popen is not None, "started above"
                procs["gpuaas-extender"] = ext.popen.pid
            if floor:
                procs["floor-extender"] = floor.pid
            time.sleep(3)  # the creations' watch events settle
            idle_before = {name: cpu_seconds(pid) for name, pid in procs.items()}
            time.sleep(idle_s)
            idle = {name: (cpu_seconds(pid) - idle_before[name]) / idle_s for name, pid in procs.items()}
            cpu_before = {name: cpu_seconds(pid) for name, pid in procs.items()}
            split_before = {name: cpu_user_system(pid) for name, pid in procs.items()}
            requests_before = apiserver_requests(apiserver_metrics(cluster))
            ext_before = extender_seconds(ext.url) if ext else {}
            t0 = time.monotonic()
            cluster.control_plane.start_scheduler()
            while (left := unbound(core, "tput")) > 0:
                if time.monotonic() - t0 > timeout:
                    raise SystemExit(f"{left} pods still unbound after {timeout}s ({config})")
                time.sleep(0.25)
            elapsed = time.monotonic() - t0
            # CPU is read once every pod is Running too: kwok's status patches (and their watch events) are work per
            # pod that a fast run would otherwise leave after its clock stops and a slow one pay inside it.
            while not_running(core, "tput") > 0 and time.monotonic() - t0 < timeout:
                time.sleep(0.25)
            settled = time.monotonic() - t0
            cpu = {name: cpu_seconds(pid) - cpu_before[name] for name, pid in procs.items()}
            system_share = {name: round((cpu_user_system(pid)[1] - split_before[name][1]) / cpu[name], 3)
                            for name, pid in procs.items() if cpu[name] > 0}
            state = cluster.control_plane.state  # read again: the scheduler was started since
            assert state is not None
            scheduler_pid = state.components["kube-scheduler"].pid
            cpu["kube-scheduler"] = cpu_seconds(scheduler_pid)
            metrics_after = apiserver_metrics(cluster)
            # kube-scheduler runs only from the clock's start: its idle rate is read after the run instead, every
            # pod bound and none pending (the others' is read before, so their request counts above leave it out).
            scheduler_before = cpu_seconds(scheduler_pid)
            time.sleep(idle_s)
            idle["kube-scheduler"] = (cpu_seconds(scheduler_pid) - scheduler_before) / idle_s
            requests = apiserver_requests(metrics_after)
            requests.subtract(requests_before)
            seconds = {k: v for k, v in requests.items() if k.startswith(SECONDS)}
            counts = Counter({k: v for k, v in requests.items() if not k.startswith(SECONDS)})
            busiest = {k: int(v) for k, v in counts.most_common(10) if v > 0}
            # how long the apiserver took per request of each busy kind (a Binding is gpuaas's or kube-scheduler's)
            answer_ms = {k: round(seconds[SECONDS + k] / 1000 / v, 2) for k, v in busiest.items()
                         if seconds.get(SECONDS + k)}
            out = {"config": config, "cpu_pods_entry": cpu_entry, "all_pods": all_pods, "nodes": nodes, "pods": pods,
                   "cpu_only_pods": sizes.count(0), "gpus_requested": sum(sizes),
                   "seconds": round(elapsed, 2), "pods_per_second": round(pods / elapsed, 1),
                   "seconds_until_all_running": round(settled, 2),
                   "cpu_seconds_while_scheduling": {k: round(v, 2) for k, v in cpu.items()},
                   "cpu_ms_per_pod": {k: round(1000 * v / pods, 2) for k, v in cpu.items()},
                   "system_cpu_share": system_share,  # of each component's CPU, the kernel's (kube-scheduler: none)
                   "idle_cpu_per_s": {k: round(v, 3) for k, v in idle.items()},
                   "cpu_ms_per_pod_above_idle": {k: round(1000 * (v - idle.get(k, 0.0) * settled) / pods, 2)
                                                 for k, v in cpu.items()},
                   "apiserver_requests_while_scheduling": busiest,
                   "apiserver_ms_per_request": answer_ms,
                   "apiserver_watches": apiserver_watches(metrics_after),
                   "cpus": {"extender": sorted(os.sched_getaffinity(extender_pid)) if extender_pid else [],
                            "the_others": sorted(os.sched_getaffinity(0))}}
            if ext:
                spent = {k: v - ext_before.get(k, 0.0) for k, v in extender_seconds(ext.url).items()}
                out["extender_options"] = extender_options or []
                out["extender_ms_per_pod"] = {k[:-2]: round(1000 * v / pods, 3) for k, v in sorted(spent.items())
                                              if k.endswith("_s")}
                out["extender_calls"] = {k[:-6]: int(v) for k, v in sorted(spent.items()) if k.endswith("_calls")}
                out["extender_connections"] = time_wait(port)
                if cpu_split:  # written as the extender exits
                    ext.stop()
                    out["extender_cpu_split_ms_per_pod"] = read_cpu_split(split_file, pods)
            return out
        finally:
            if ext:
                ext.stop()  # (terminate() does nothing to a process already gone)
            if floor:
                floor.kill()
                floor.wait(10)
            cluster.down()


CPU_SPLIT_ENV = "GPUAAS_CPU_SPLIT"  # read by bench/cpu_split/sitecustomize.py in the extender process


def read_cpu_split(path: Path, pods: int) -> dict[str, Any]:
    """bench/cpu_split's totals per pod (ms): each wrapped part (without the wrapped parts inside it: `filter`
    without its queue planning), and `other`, what the parts leave of the process's CPU since the first filter (HTTP
    server and client, event loop, bind)."""
    try:
        seconds = json.loads(path.read_text())["seconds"]
    except (OSError, ValueError, KeyError) as err:
        return {"error": f"{path}: {err}"}
    process = seconds.pop("process", 0.0)
    parts = dict(seconds)
    parts["other"] = process - sum(seconds.values())
    parts["total"] = process
    return {k: round(1000 * v / pods, 3) for k, v in sorted(parts.items())}


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


# The ratios summary() prints where both configurations ran: (name, configuration, to).
RATIOS = (("ratio_to_same_profile", "extender", "same_profile"), ("ratio_to_default", "extender", "default"),
          ("same_profile_to_default", "same_profile", "default"), ("floor_to_same_profile", FLOOR, "same_profile"),
          ("extender_to_floor", "extender", FLOOR), ("floor_watching_to_floor", FLOOR_WATCHING, FLOOR),
          ("extender_to_floor_watching", "extender", FLOOR_WATCHING),
          ("floor_bare_to_floor", FLOOR_BARE, FLOOR), ("floor_bare_to_same_profile", FLOOR_BARE, "same_profile"),
          ("extender_bare_to_extender", EXTENDER_BARE, "extender"),
          ("extender_bare_to_same_profile", EXTENDER_BARE, "same_profile"))


def summary(runs: dict[str, list[dict]]) -> dict:
    """Medians over the rounds per configuration; ratios per round (runs next to each other), their median and
    range."""
    out: dict[str, Any] = {}
    for config, rs in runs.items():
        comps = sorted({c for r in rs for c in r["cpu_ms_per_pod"]})
        out[config] = {
            "pods_per_second": median([r["pods_per_second"] for r in rs]),
            "pods_per_second_runs": [r["pods_per_second"] for r in rs],
            "cpu_ms_per_pod": {c: median([r["cpu_ms_per_pod"].get(c, 0.0) for r in rs]) for c in comps},
            "cpu_ms_per_pod_above_idle": {c: median([r["cpu_ms_per_pod_above_idle"].get(c, 0.0) for r in rs])
                                          for c in comps},
        }
        if config in GPUAAS:
            keys = sorted({k for r in rs for k in r["extender_ms_per_pod"]})
            out[config]["extender_ms_per_pod"] = {k: median([r["extender_ms_per_pod"].get(k, 0.0) for r in rs])
                                                  for k in keys}
    for name, config, to in RATIOS:
        if config in runs and to in runs:
            out[name] = round_ratios(runs[config], runs[to])
    return out


def round_ratios(runs: list[dict], to: list[dict]) -> dict:
    """Pods/s of `runs` over `to` per round (runs next to each other), their median and range."""
    per_round = [round(a["pods_per_second"] / b["pods_per_second"], 3) for a, b in zip(runs, to, strict=True)]
    return {"median": median(per_round), "min": min(per_round), "max": max(per_round), "rounds": per_round}


def cpu_pods_entry_comparison(args: argparse.Namespace, common: dict[str, Any]) -> dict:
    """The schemes for pods that ask for no GPU (docs/extender.md), on the same pods: the GPU entry alone (such pods
    placed by kube-scheduler's own scoring), with the CPU-pod entry as deploy/ ships it, and every pod through the
    GPU entry. Rounds interleaved like main's; ratios per round to the GPU entry alone, their median and range."""
    schemes = {"gpu_entry_only": (False, False), "with_cpu_pods_entry": (True, False),  # (cpu_entry, all_pods)
               "all_pods_through_gpu_entry": (False, True)}
    names = list(schemes)
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            cpu_entry, all_pods = schemes[name]
            run = one_run(args.nodes, args.pods, args.seed, "extender", args.timeout, cpu_entry=cpu_entry,
                          all_pods=all_pods, **common)
            run["round"] = r
            runs[name].append(run)
            print(json.dumps({"progress": name, "round": r, "pods_per_second": run["pods_per_second"]}),
                  file=sys.stderr, flush=True)

    return {"bench": "scheduler_throughput", "comparison": "cpu_pods_entry", "nodes": args.nodes, "pods": args.pods,
            "cpu_only_share": args.cpu_only_share, "repeats": args.repeats,
            "pods_per_second": {n: median([r["pods_per_second"] for r in rs]) for n, rs in runs.items()},
            "ratio_cpu_pods_entry": round_ratios(runs["with_cpu_pods_entry"], runs["gpu_entry_only"]),
            "ratio_all_pods": round_ratios(runs["all_pods_through_gpu_entry"], runs["gpu_entry_only"]),
            "runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the three configurations, interleaved")
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help=f"which of {','.join(CONFIGS)} to run, and {FLOOR}: the same profile against a "
                        f"do-nothing extender that binds, {FLOOR_WATCHING}: that extender also keeping the "
                        f"extender's two watches, {FLOOR_BARE}: that extender on a bare server instead of "
                        f"aiohttp's, {EXTENDER_BARE}: gpuaas's extender on that bare server (ratios are printed for "
                        "the pairs that ran)")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--idle-s", type=float, default=5.0, help="the quiet window that measures idle CPU")
    parser.add_argument("--percentage-of-nodes-to-score", type=int, default=None,
                        help="override the gpuaas profile's 100 (0 = kube-scheduler's adaptive sample)")
    parser.add_argument("--cpu-only-share", type=float, default=0.0,
                        help="fraction of the pods that ask for no GPU (default 0: GPU pods only)")
    parser.add_argument("--extender-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an extender setting (e.g. queue_planning_min_pods=0), passed in its environment")
    parser.add_argument("--extender-cpu", type=int, metavar="N",
                        help="run the extender alone on CPU N and every other component on the other CPUs (as "
                             "deployed with cores of its own)")
    parser.add_argument("--cpu-split", action="store_true",
                        help="also say where the extender's CPU went, per pod (bench/cpu_split: filter, its queue "
                             "planning, bind's renew, request validation, reply encoding, watch decoding and "
                             "handling, log lines, garbage collection, and the rest)")
    parser.add_argument("--cpu-pods-entry", action="store_true",
                        help="instead: the extender with the GPU entry alone, with the CPU-pod entry (as deploy/ "
                             "ships it) and with every pod through the GPU entry (all_pods), same pods, --repeats "
                             "rounds interleaved; ratio_cpu_pods_entry and ratio_all_pods are to the first")
    args = parser.parse_args()
    common: dict[str, Any] = {"cpu_share": args.cpu_only_share, "idle_s": args.idle_s}
    if args.extender_cpu is not None:
        cpus = os.sched_getaffinity(0)
        if args.extender_cpu not in cpus or len(cpus) < 2:
            parser.error(f"--extender-cpu {args.extender_cpu}: this process may run on CPUs {sorted(cpus)}; the "
                         "extender needs one of them and the other components at least one more")
        os.sched_setaffinity(0, cpus - {args.extender_cpu})  # inherited by every component started from here
        common["extender_cpu"] = args.extender_cpu
    if args.cpu_split:  # the extender process loads bench/cpu_split/sitecustomize.py (PYTHONPATH goes to children)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(Path(__file__).with_name("cpu_split")), os.environ.get("PYTHONPATH", "")) if p)
        common["cpu_split"] = True
    if args.cpu_pods_entry:
        print(json.dumps(cpu_pods_entry_comparison(args, common), indent=2))
        return
    configs = [c for c in args.configs.split(",") if c]
    known = (*CONFIGS, *FLOORS, EXTENDER_BARE)
    unknown = [c for c in configs if c not in known]
    if unknown or not configs:
        parser.error(f"--configs: unknown {unknown}; choose from {', '.join(known)}")
    runs: dict[str, list[dict]] = {c: [] for c in configs}
    for r in range(args.repeats):
        for config in configs[r % len(configs):] + configs[:r % len(configs)]:
            sample = None if config == "default" else args.percentage_of_nodes_to_score
            run = one_run(args.nodes, args.pods, args.seed, config, args.timeout, sample,
                          extender_options=args.extender_option if config in GPUAAS else None, **common)
            run["round"] = r
            runs[config].append(run)
            print(json.dumps({"progress": config, "round": r, "pods_per_second": run["pods_per_second"]}),
                  file=sys.stderr, flush=True)
    out: dict[str, Any] = {"bench": "scheduler_throughput", "nodes": args.nodes, "pods": args.pods,
                           "repeats": args.repeats,
                           "percentage_of_nodes_to_score": args.percentage_of_nodes_to_score or "100 (gpuaas profile)",
                           "extender_options": args.extender_option, "target_ratio_to_same_profile": 0.8,
                           "target_extender_cpu_ms_per_pod": 1.0, "runs": runs}
    out["summary"] = summary(runs)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
