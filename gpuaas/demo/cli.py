"""`gpuaas demo`: the whole platform on a local KWOK GPU cluster, compared with kube-scheduler's default scoring.

    gpuaas demo [--duration 5m] [--speed K] [--out DIR] [--keep] [--no-compare] [--scheduler gpuaas|default]

Brings up the demo fleet (gpuaas/pools/demo.yaml: A100 and H100 pools, a MIG pool, a node group that can grow) with
the extender, the replica autoscaler, the nodescaler and Prometheus (gpuaas/demo/stack.py), submits the timeline of
gpuaas/demo/timeline.py (training jobs and gangs, MIG pods, a burst beyond the fleet, inference Deployments on the Azure
LLM trace), prints a status line per cluster every sample, and at the end writes run.json and the HTML report
(gpuaas/report), then prints where each pod landed and why the pending ones wait. The same timeline runs at the same
time on a second cluster whose kube-scheduler has no extender (`--no-compare` skips it).
"""
from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

from runtime.pools import PoolSpec, PoolSpecError

from ..cluster.cli import cluster_dir
from ..cluster.components import REPO
from ..cluster.controlplane import ControlPlane, ControlPlaneError
from ..cluster.local import resolve_pool_spec
from ..cluster.tools import ToolsMissing
from ..loadgen.trace import TraceError, load_trace, synthetic_trace
from ..plotting import MatplotlibMissing, require_matplotlib
from . import agreement
from .sampling import go_duration, utc_now
from .stack import RunSettings, Stack
from .timeline import SLO_QUEUE_WAIT_S, build_timeline, timeline_workload

DEFAULT_TRACE = REPO.parent / "shared" / "data" / "traces" / "AzureLLMInferenceTrace_code.csv"
SCHEDULERS = ("gpuaas", "default")
PRIMARY_NAME = "demo"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="run the platform on a local KWOK GPU cluster and write a report",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--duration", default="5m", type=parse_duration,
                        help="how long the workload timeline runs, wall clock (e.g. 60s, 5m); default: %(default)s")
    parser.add_argument("--speed", default=10.0, type=positive_float,
                        help="trace time runs K times faster than the wall clock (arrivals, service times, cold "
                             "starts, scrape and autoscaler periods); default: %(default)s")
    parser.add_argument("--out", type=Path, help="directory for run.json, report.html and the plots (default: "
                                                 "the demo cluster's work directory, .../clusters/demo/report)")
    parser.add_argument("--keep", action="store_true", help="leave the demo cluster running (stop it with "
                                                             "`gpuaas cluster down --name demo`)")
    parser.add_argument("--no-compare", dest="compare", action="store_false",
                        help="skip the run with kube-scheduler's default scoring")
    parser.add_argument("--scheduler", choices=SCHEDULERS, default="gpuaas",
                        help="the scheduler of the demo cluster (the one --keep keeps): gpuaas (kube-scheduler with "
                             "the gpuaas extender) or default (kube-scheduler alone); the comparison runs the other")
    parser.add_argument("--pools", default="demo", help="pool spec (file or built-in name); default: %(default)s")
    parser.add_argument("--trace", type=Path, default=None,
                        help="request trace of the inference Deployments (Azure LLM format); default: "
                             f"{DEFAULT_TRACE} where it is, else a synthetic trace of the same shape")
    parser.add_argument("--seed", type=int, default=7, help="seed of the training-job stream; default: %(default)s")
    parser.set_defaults(func=run)


def parse_duration(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = go_duration(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 90, 60s, 5m, 1m30s)") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"duration must be positive, got {text!r}")
    return seconds


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


# -- the record -------------------------------------------------------------------------------------------------------

def pools_record(pools: PoolSpec) -> list[dict[str, Any]]:
    return [{"name": p.name, "model": p.gpu.model if p.gpu else "", "gpus_per_node": p.gpu.count if p.gpu else 0,
             "nodes": p.count, "mig": p.gpu.mig if p.gpu else None, "group": p.autoscale is not None}
            for p in pools.pools]


def raw_record(*, started_at: str, duration_s: float, speed: float, pools: PoolSpec,
               runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"version": 1, "started_at": started_at, "duration_s": duration_s, "speed": speed,
            "slo_queue_wait_s": SLO_QUEUE_WAIT_S, "pools": pools_record(pools), "runs": runs}


def with_summaries(raw: dict[str, Any]) -> dict[str, Any]:
    """The run record validated by gpuaas.report's RunRecord (RunRecordError names a bad field), each run's summary
    computed the report's way."""
    from ..report import compute_summary, parse_run_record

    record = parse_run_record(raw)
    runs = {k: run.model_copy(update={"summary": compute_summary(run)}) for k, run in record.runs.items()}
    return record.model_copy(update={"runs": runs}).model_dump(mode="json")


# -- the terminal -----------------------------------------------------------------------------------------------------

def status_line(scheduler: str, sample: dict[str, Any], slo: tuple[int, int], dead: list[str]) -> str:
    reps = "+".join(str(d["replicas"]) for d in sample["deployments"].values()) or "-"
    met, total = slo
    return (f"{sample['t']:6.0f}s {scheduler:<7} nodes {sample['nodes']:2d} ({sample['gpu_nodes_ready']:2d} GPU-ready)"
            f"  GPUs {sample['gpus_allocated']:5.1f}/{sample['gpus_total']:<3d} {sample['allocation_ratio']:4.0%}"
            f"  frag {sample['fragmentation_ratio']:4.0%}  pods {sample['pods_running']:3d} running"
            f" {sample['pods_pending']:2d} pending {sample['pods_succeeded']:3d} done  replicas {reps}"
            f"  SLO {f'{met / total:.1%}' if total else '-'}" + (f"  DEAD: {', '.join(dead)}" if dead else ""))


def print_table(final: dict[str, Any], out=sys.stdout) -> None:
    """Where each pod that holds GPUs runs, then the pending pods with the scheduler's reason."""
    rows = [(p["pod"], p["request"], p["node"], p["gpu"] or "-", "Running") for p in final["placements"]]
    rows += [(p["pod"], p.get("request") or "", "-", "-", "Pending") for p in final["pending"]]
    head = ("POD", "REQUEST", "NODE", "GPU", "PHASE")
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    print("  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)), file=out)
    reasons = {p["pod"]: p["reason"] for p in final["pending"]}
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)), file=out)
        if r[0] in reasons:
            print(f"    why pending: {reasons[r[0]]}", file=out)


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:g} s"


def summary_line(scheduler: str, run: dict[str, Any], gangs_total: int) -> str:
    s, final = run["summary"], run["final"]
    whole = [n for n in final["gpu_nodes"] if n["whole_gpus"] > 0]

    def pct(x):
        return "-" if x is None else f"{x:.1%}"

    gangs = final.get("gangs") or []
    placed_whole = sum(1 for g in gangs if g["all_bound_after_s"] is not None)
    half = sum(1 for g in gangs if (g["half_placed_s"] or 0) > 2)  # conditions have whole seconds
    most = max((x["nodes"] for x in run["samples"]), default=final["nodes"])
    return (f"{scheduler:<7}: mean GPU allocation {pct(s['mean_allocation_ratio'])}, SLO attainment "
            f"{pct(s['slo_attainment'])}, GPU-node-hours {s['gpu_node_hours']:.2f}, nodes at the end {final['nodes']}"
            f" (at most {most}), gangs placed whole {placed_whole} of {gangs_total} ({half} half-placed over 2 s), "
            f"pods pending at the end {final['pods_pending']}; whole-GPU nodes left completely free for 8-GPU jobs: "
            f"{s['whole_nodes_free_at_end']} of {len(whole)}")


def _rounded(t: float | None) -> float | None:
    return None if t is None else round(max(0.0, t), 3)


def services_slo(stack: Stack, simulated: dict[str, agreement.Simulated]) -> dict[str, dict[str, Any]]:
    """Per inference service: the demo's SLO attainment, the simulator's, and what says why they differ
    (gpuaas/demo/agreement.py)."""
    from ..report.model import ReplicaRecord

    s = stack.settings
    out = {}
    for svc in s.services:
        sim = simulated[svc.name]
        met, total = stack.served.get(svc.name, (0, 0))
        demo = met / total if total else 0.0
        replicas = [ReplicaRecord(pod=r.pod, listed_s=round(max(0.0, r.listed), 3), bound_s=_rounded(r.bound),
                                  serving_s=_rounded(r.serving), gone_s=_rounded(r.gone))
                    for r in stack.replica_times.get(svc.name, ())]
        gpus = stack.gpus_seen.get(svc.name, [])
        replayed = agreement.replayed(s.trace, svc, replicas, speed=s.speed, duration_s=s.duration_s,
                                      slo_s=SLO_QUEUE_WAIT_S) if replicas else None
        on_gpus = agreement.on_demo_gpus(s.trace, svc, [(t, held + free) for t, held, free in gpus], replicas,
                                         speed=s.speed, duration_s=s.duration_s) if gpus else None
        out[svc.name] = {"demo": demo, "demo_requests": total,
                         "simulated": sim.slo_attainment, "simulated_requests": sim.requests,
                         "initial_replicas": sim.initial_replicas, "command": sim.command,
                         "simulated_low": sim.low, "simulated_high": sim.high, "replayed": replayed,
                         "on_demo_gpus": on_gpus.slo_attainment if on_gpus else None,
                         "on_demo_gpus_low": on_gpus.low if on_gpus else None,
                         "on_demo_gpus_high": on_gpus.high if on_gpus else None,
                         "why": agreement.explain(demo, sim.slo_attainment, sim.low, sim.high, replayed, on_gpus),
                         "replicas": [r.model_dump() for r in replicas],
                         "gpus": [{"t": round(t, 2), "held": held, "free": free} for t, held, free in gpus]}
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def print_services(record: dict[str, Any]) -> None:
    """Per inference service: the demo's SLO attainment beside the simulator's for the same window and policy, and
    the measurements that say why they differ."""
    print(f"\nSLO attainment (queue wait <= {SLO_QUEUE_WAIT_S:g} s) per service: the demo beside `gpuaas simulate "
          "autoscaling` on the same trace window, ours, the same warm start and rate windows, no controller memory "
          "(over scrape and controller phases: low-high); the simulator's serving model on the demo's own replicas; "
          "the simulator on the GPUs the demo's cluster left the service:")
    for scheduler, run in record["runs"].items():
        for name, s in (run.get("services") or {}).items():
            gap = 100 * (s["demo"] - s["simulated"])
            print(f"  {scheduler:<7} {name:<11} demo {100 * s['demo']:6.2f}% ({s['demo_requests']} requests)  "
                  f"simulated {100 * s['simulated']:6.2f}% ({s['simulated_requests']}; phases "
                  f"{_pct(s.get('simulated_low'))}-{_pct(s.get('simulated_high'))})  {gap:+.2f} points  "
                  f"demo's replicas {_pct(s.get('replayed'))}  demo's GPUs {_pct(s.get('on_demo_gpus'))} "
                  f"({_pct(s.get('on_demo_gpus_low'))}-{_pct(s.get('on_demo_gpus_high'))})  "
                  f"(started with {s['initial_replicas']} replicas)")
    commands = {n: s["command"] for run in record["runs"].values() for n, s in (run.get("services") or {}).items()}
    for name, command in commands.items():
        print(f"  {name}: {command}")
    for scheduler, run in record["runs"].items():
        for name, s in (run.get("services") or {}).items():
            if s.get("why"):
                print(f"  {scheduler} {name}, more than {agreement.FAR_POINTS:g} points apart: {s['why']}")


def idle_line(scheduler: str, idle: dict[str, Any] | None) -> str:
    """The idle-GPU report of one run, in a line (the report's section has the table)."""
    if idle is None:
        return f"{scheduler:<7}: idle GPUs not looked for"
    head = f"{scheduler:<7}: idle GPUs (use below {100 * idle['threshold']:g}% over the last {idle['window_s']:g}s)"
    if idle.get("error"):
        return f"{head}: no answer: {idle['error']}"
    found = ", ".join(f"{w['namespace']}/{w['kind'].lower()}/{w['name']} ({w['gpus']:.2g} GPU at "
                      f"{100 * w['utilization']:.1f}%, {w['gpu_hours']:.3f} GPU-h)" for w in idle["workloads"])
    return f"{head}: {found or 'none'}; {len(idle['busy'])} busy, {len(idle['unmeasured'])} without series"


def print_intro(stacks: list[Stack], timings: list[dict[str, float]], settings: RunSettings, trace: str) -> None:
    for s, t in zip(stacks, timings, strict=True):
        assert s.prometheus is not None, "up() starts it"
        print(f"  {s.name}: cluster ready in {t['total_s']:.1f}s; Prometheus {s.prometheus.url}; "
              f"{', '.join(c.name for c in s.components)} running under their ServiceAccounts; "
              f"logs {s.workdir / 'logs'}")
    print(f"\ntimeline over {settings.duration_s:g}s (trace {trace} at {settings.speed:g}x):")
    for svc in settings.services:
        print(f"  {'before':>7}  {svc.name:<13} {svc.what}")
    for sub in settings.timeline:
        print(f"  {sub.at_s:6.1f}s  {sub.name:<13} {sub.what}")
    print(f"\nevery {settings.sample_s:g}s, per cluster: nodes (GPU nodes ready), GPUs allocated, fragmentation, "
          f"pods, replicas of {' + '.join(svc.name for svc in settings.services)}, share of requests within the "
          f"{SLO_QUEUE_WAIT_S:g}s queue-wait SLO so far\n", flush=True)


def print_end(record: dict[str, Any], primary: Stack, gangs_total: int) -> None:
    final = record["runs"][primary.scheduler]["final"]
    print(f"\n{primary.name} ({primary.scheduler}) at the end:")
    print_table(final)
    print(f"({final['pods_succeeded']} pods finished during the run)\n")
    for scheduler, run in record["runs"].items():
        for g in run["final"].get("gangs") or ():
            print(f"  {scheduler:<7} gang {g['gang']:<10} {g['size']} pods: all bound after "
                  f"{_s(g['all_bound_after_s'])}, all running after {_s(g['all_running_after_s'])}, half-placed "
                  f"{_s(g['half_placed_s'])}")
    for scheduler, run in record["runs"].items():
        print(summary_line(scheduler, run, gangs_total))
    for scheduler, run in record["runs"].items():
        print(idle_line(scheduler, run.get("idle")))
    print_services(record)


# -- the run ----------------------------------------------------------------------------------------------------------

def _fresh_workdir(name: str) -> Path:
    workdir = cluster_dir(name)
    if (workdir / "state.json").exists() and ControlPlane(workdir, name=name).attach_existing():
        raise ControlPlaneError(f"cluster {name} is still running from an earlier demo; stop it with "
                                f"`gpuaas cluster down --name {name}`")
    if workdir.exists():
        shutil.rmtree(workdir)  # the previous demo's logs, data and report
    (workdir / "logs").mkdir(parents=True)
    return workdir


def _parallel(calls: list) -> list:
    """Run the calls in threads; re-raise the first exception."""
    results: list = [None] * len(calls)
    errors: list[BaseException] = []

    def call(i, f):
        try:
            results[i] = f()
        except BaseException as err:  # re-raised below, in the caller's thread
            errors.append(err)

    threads = [threading.Thread(target=call, args=(i, f)) for i, f in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def sample_until(stacks: list[Stack], t0: float, duration_s: float, every_s: float) -> dict[str, list[dict[str, Any]]]:
    """Sample every cluster every `every_s` seconds from `t0` to `duration_s`, printing a status line for each."""
    samples: dict[str, list[dict[str, Any]]] = {s.scheduler: [] for s in stacks}
    next_sample = 0.0
    while True:
        for s in stacks:
            try:
                sample = s.sample()
            except Exception as err:  # an apiserver or Prometheus blip costs a sample, not the run
                logging.getLogger("gpuaas.demo").exception("sampling %s", s.name)
                print(f"{s.elapsed():6.0f}s {s.scheduler:<7} no sample: {err}", flush=True)
                continue
            samples[s.scheduler].append(sample)
            print(status_line(s.scheduler, sample, s.slo_so_far(), s.dead_components()), flush=True)
        if time.monotonic() - t0 >= duration_s:
            return samples
        next_sample += every_s
        time.sleep(max(0.0, min(next_sample, duration_s) - (time.monotonic() - t0)))


def run(args: argparse.Namespace) -> int:
    wall0 = time.monotonic()
    try:
        require_matplotlib("the demo's report")  # asked now, not after the run (bin/gpuaas's venv has it)
    except MatplotlibMissing as err:
        print(f"gpuaas demo: {err}", file=sys.stderr)
        return 2
    try:
        pools = resolve_pool_spec(args.pools)
    except PoolSpecError as err:
        print(f"gpuaas demo: {err}", file=sys.stderr)
        return 2
    try:
        trace_file = args.trace or (DEFAULT_TRACE if DEFAULT_TRACE.exists() else None)
        if trace_file is None:
            trace, trace_label = synthetic_trace(), f"synthetic ({DEFAULT_TRACE} not found)"
        else:
            trace, trace_label = load_trace(trace_file), trace_file.name
    except TraceError as err:
        print(f"gpuaas demo: --trace: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"gpuaas demo: --trace {args.trace}: {err.strerror or err} (a request trace in the Azure LLM format)",
              file=sys.stderr)
        return 2
    schedulers = [args.scheduler] + ([s for s in SCHEDULERS if s != args.scheduler] if args.compare else [])
    names = {s: PRIMARY_NAME if i == 0 else f"{PRIMARY_NAME}-{s}" for i, s in enumerate(schedulers)}
    try:
        workdirs = {s: _fresh_workdir(names[s]) for s in schedulers}
    except (ControlPlaneError, ToolsMissing) as err:
        print(f"gpuaas demo: {err}", file=sys.stderr)
        return 1
    primary_dir = workdirs[schedulers[0]]
    outdir = args.out or primary_dir / "report"
    logging.basicConfig(filename=primary_dir / "logs" / "demo.log", level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    timeline = build_timeline(args.duration, seed=args.seed)
    settings = RunSettings(duration_s=args.duration, speed=args.speed, trace=trace, timeline=timeline,
                           workload=timeline_workload(timeline), sample_s=max(2.0, args.duration / 60))
    stacks: list[Stack] = []
    try:
        stacks = [Stack(s, names[s], workdirs[s], pools, settings, owned=not (args.keep and i == 0))
                  for i, s in enumerate(schedulers)]
        gpus = sum(p.count * (p.gpu.count if p.gpu else 0) for p in pools.pools)
        print(f"starting {len(stacks)} local control plane(s) with {pools.node_count} KWOK GPU nodes ({gpus} GPUs) "
              f"each: {', '.join(f'{s.name} ({s.scheduler})' for s in stacks)} ...", flush=True)
        timings = [s.up() for s in stacks]  # in this thread: the processes die with the thread that started them
        for s in stacks:
            s.wait_ready()
        print_intro(stacks, timings, settings, trace_label)
        # What the simulator gives for each service's window and policy, to print beside what the demo measures.
        simulated = {svc.name: agreement.simulated(trace, svc, speed=args.speed, duration_s=args.duration,
                                                   trace_path=str(trace_file or "TRACE")) for svc in settings.services}
        t0, epoch, started_at = time.monotonic(), time.time(), utc_now()
        for s in stacks:
            s.start(t0, epoch)
        samples = sample_until(stacks, t0, args.duration, settings.sample_s)
        print(f"\nthe timeline is over after {time.monotonic() - t0:.0f}s; stopping the autoscalers and the load, "
              "waiting for the clusters to settle ...", flush=True)
        settle0 = time.monotonic()
        finals = _parallel([s.finish for s in stacks])
        print(f"settled in {time.monotonic() - settle0:.0f}s; final state read", flush=True)
        runs = {s.scheduler: {"scheduler": s.scheduler, "samples": samples[s.scheduler], "events": s.events,
                              "final": final, "idle": s.idle, "services": services_slo(s, simulated)}
                for s, final in zip(stacks, finals, strict=True)}
        raw = raw_record(started_at=started_at, duration_s=args.duration, speed=args.speed, pools=pools, runs=runs)
        outdir.mkdir(parents=True, exist_ok=True)
        (outdir / "run.json").write_text(json.dumps(raw, indent=1))  # kept as it is if it does not validate
        from ..report import RunRecordError, write_report

        try:
            record = with_summaries(raw)
        except RunRecordError as err:
            print(f"gpuaas demo: the run record {outdir / 'run.json'} is not valid, no report: {err}",
                  file=sys.stderr)
            return 1
        (outdir / "run.json").write_text(json.dumps(record, indent=1))
        report = write_report(record, outdir)
        print_end(record, stacks[0], sum(1 for sub in timeline if sub.kind == "gang"))
        errors = [e for s in stacks for e in s.submit_errors]
        if errors:
            print(f"\nsubmissions that failed: {'; '.join(errors)}")
        print(f"\nrun record {outdir / 'run.json'}\nreport {report}")
        if args.keep:
            print(f"the cluster keeps running: export KUBECONFIG={stacks[0].cluster.kubeconfig}; stop it with "
                  f"`gpuaas cluster down --name {PRIMARY_NAME}` (gpuaas's components stopped with this command: "
                  "GPU pods created from now on stay Pending)")
        print(f"total wall time {time.monotonic() - wall0:.0f}s")
        return 0
    except (ToolsMissing, ControlPlaneError, TimeoutError, RuntimeError) as err:
        print(f"gpuaas demo: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ngpuaas demo: interrupted; stopping the clusters", file=sys.stderr)
        return 130
    finally:
        _parallel([lambda s=s, i=i: s.down(keep=args.keep and i == 0) for i, s in enumerate(stacks)])
