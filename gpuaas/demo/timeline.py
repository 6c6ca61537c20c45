"""What the demo submits, and when: a timeline of GPU workloads scaled to the run's duration, and the inference services
that replay the Azure LLM trace. Pure: the same arguments give the same timeline, for every scheduler compared.

The timeline (times are fractions of the run's duration D, wall clock):

- before 0:   two inference Deployments (one GPU per replica, already serving when the trace starts) that the
              replica autoscaler scales on the trace's load;
- 0:          a long pre-training gang (2 pods x 8 GPUs); at 0.05 D long-running MIG services;
- 0 .. 0.75 D: a stream of single-pod training jobs (1, 2, 4 or 8 whole GPUs) that finish after 0.1-0.3 D;
- 0.10 D:     a pod asking for 16 GPUs, more than any node has (it stays Pending, and says why);
- 0.15, 0.35, 0.55 D: gangs of multi-GPU pods, placed all-or-nothing by the gang controller (docs/gangs.md);
- 0.40 D:     a second wave of MIG pods that finish;
- 0.50 D:     a burst of 8-GPU batch pods that exceeds the fleet: the node group grows for them, and shrinks after.

What the pods do with their GPUs is made up for the idle-GPU report (gpuaas/loadgen/dcgm.py, the annotation
`gpuaas.io/simulated-gpu-utilization`): training pods use 90 %, the MIG services 50-60 %, and `rerank-0`, a MIG
service nobody calls, 2 %: the idle workload the report should name. The inference replicas use what the replayed load
gives them.

Finite jobs are sized to end by 0.85 D when they start on time, so the cluster is quiet when the run ends and its
final state is what `kubectl` shows afterwards.

`--speed K` compresses trace time: the serving system runs K times faster than the wall clock. Arrival times, request
service times, the replica cold start (60 s), Prometheus's scrape interval (15 s) and the autoscaler's period and rate
windows are all divided by K, so the replicas see the load the trace describes, only sooner; queue waits and arrival
rates are reported in trace time (wall seconds x K), against the trace-time SLO.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Literal

from scoring.fragmentation import Shape, Workload
from scoring.gangs import GANG_LABEL, GANG_SIZE_ANNOTATION
from scoring.kubeobjects import pod_demand
from scoring.model import MAX_GPUS_PER_NODE

from ..loadgen.dcgm import UTILIZATION_ANNOTATION
from ..loadgen.serving import ServiceModel
from ..loadgen.trace import Arrival, scale_rate
from ..workloads import gpu_deployment, gpu_pod

TRAINING_NS = "training"
INFERENCE_NS = "inference"
NAMESPACES = (TRAINING_NS, INFERENCE_NS)
FINITE_END = 0.85  # finite jobs end by this fraction of the run if they start when submitted

# The trace's service model in trace time (docs/autoscaling.md): these are divided by the speed.
TRACE_SCRAPE_S = 15.0
TRACE_SYNC_S = 15.0
TRACE_WINDOWS_S = {"rate_window": 60.0, "short_rate_window": 30.0, "service_window": 120.0}
SLO_QUEUE_WAIT_S = 2.0
MIN_SCRAPES_PER_WINDOW = 2.5


@dataclass(frozen=True)
class Submission:
    at_s: float  # wall seconds after the start of the run
    name: str
    what: str  # for the terminal and the record
    kind: Literal["pod", "gang"]
    objects: tuple[dict[str, Any], ...]

    @property
    def namespace(self) -> str:
        return self.objects[0]["metadata"]["namespace"]


@dataclass(frozen=True)
class InferenceService:
    """A Deployment of one-GPU replicas serving the trace, `rate_scale` times its arrivals, starting `offset_s` trace
    seconds into it (the trace wraps around), scaled by the replica autoscaler between min and max replicas."""
    name: str
    rate_scale: int
    offset_s: float
    min_replicas: int = 1
    max_replicas: int = 12

    @property
    def key(self) -> str:
        return f"{INFERENCE_NS}/{self.name}"

    @property
    def what(self) -> str:
        return (f"inference Deployment, 1 GPU per replica, {self.min_replicas}..{self.max_replicas} replicas, the "
                f"trace x{self.rate_scale} from its minute {self.offset_s / 60:g}")

    def deployment(self, replicas: int | None = None) -> dict[str, Any]:
        """`replicas`: at the start (default min_replicas; the demo starts warm: gpuaas/demo/agreement.py)."""
        return gpu_deployment(self.name, INFERENCE_NS, replicas=replicas or self.min_replicas, gpus=1, cpu="8",
                              memory="64Gi")


# Two replicas at least: a service with a 2 s queue-wait SLO on a bursty trace does not run on one.
INFERENCE = (InferenceService("llm-code", rate_scale=2, offset_s=300.0, min_replicas=2, max_replicas=16),
             InferenceService("llm-code-b", rate_scale=1, offset_s=1500.0, min_replicas=2, max_replicas=16))


def _seconds(s: float) -> str:
    """A Go duration kwok reads (whole seconds, at least one)."""
    return f"{max(1, round(s))}s"


TRAINING_USE = 0.9
MIG_USE = {"embed-0": 0.6, "embed-1": 0.6, "rerank-0": 0.02, "chat-small-0": 0.5}  # rerank-0: nobody calls it
MIG_BATCH_USE = 0.8


def _uses(pod: dict[str, Any], share: float) -> dict[str, Any]:
    pod["metadata"].setdefault("annotations", {})[UTILIZATION_ANNOTATION] = f"{share:g}"
    return pod


def _training_pod(name: str, gpus: int, *, duration_s: float | None, labels: dict[str, str] | None = None):
    return _uses(gpu_pod(name, TRAINING_NS, gpus=gpus, cpu=str(8 * gpus), memory=f"{64 * gpus}Gi",
                         complete_after=_seconds(duration_s) if duration_s is not None else None, labels=labels),
                 TRAINING_USE)


def _mig_pod(name: str, profile: str, *, duration_s: float | None):
    return _uses(gpu_pod(name, INFERENCE_NS, mig=profile, cpu="2", memory="16Gi",
                         complete_after=_seconds(duration_s) if duration_s is not None else None),
                 MIG_USE.get(name, MIG_BATCH_USE))


def _gang(at: float, name: str, pods: int, gpus: int, duration_s: float | None) -> Submission:
    """A gang as a user writes it (docs/gangs.md): the group label and its size on every pod; gpuaas's webhook gates
    them and its gang controller places them whole, while a default-scoring cluster places them one by one."""
    objs = tuple(_training_pod(f"{name}-{i}", gpus, duration_s=duration_s, labels={GANG_LABEL: name})
                 for i in range(pods))
    for o in objs:
        o["metadata"].setdefault("annotations", {})[GANG_SIZE_ANNOTATION] = str(pods)
    done = f", done after {_seconds(duration_s)}" if duration_s is not None else ""
    return Submission(at, name, f"gang of {pods} x {gpus} GPUs{done}", "gang", objs)


def _finite(start: float, length: float, duration: float) -> float:
    """A job length that ends by FINITE_END of the run."""
    return max(1.0, min(length, FINITE_END * duration - start))


def build_timeline(duration_s: float, *, seed: int = 7, jobs: int = 20) -> list[Submission]:
    """The submissions of a run of `duration_s` wall seconds, in time order."""
    if duration_s <= 0:
        raise ValueError(f"duration must be positive, got {duration_s}")
    d = duration_s
    rng = random.Random(seed)
    subs: list[Submission] = []
    subs.append(_gang(0.0, "pretrain", 2, 8, None))
    for name, profile in (("embed-0", "1g.10gb"), ("embed-1", "1g.10gb"), ("rerank-0", "2g.20gb"),
                          ("chat-small-0", "3g.40gb")):
        subs.append(Submission(0.05 * d, name, f"MIG {profile}, long-running", "pod",
                               (_mig_pod(name, profile, duration_s=None),)))
    for i in range(jobs):
        at = 0.75 * d * i / max(1, jobs - 1)
        gpus = rng.choices((1, 2, 4, 8), weights=(4, 3, 2, 1))[0]
        length = _finite(at, rng.uniform(0.1, 0.3) * d, d)
        name = f"job-{i:02d}"
        subs.append(Submission(at, name, f"{gpus} GPU{'s' if gpus > 1 else ''}, done after {_seconds(length)}", "pod",
                               (_training_pod(name, gpus, duration_s=length),)))
    subs.append(Submission(0.10 * d, "too-big", "16 GPUs in one pod (no node has 16)", "pod",
                           (_training_pod("too-big", 16, duration_s=None),)))
    for at, name, pods, gpus, length in ((0.15, "finetune", 4, 4, 0.3), (0.35, "sweep", 2, 8, 0.25),
                                         (0.55, "rl", 3, 4, 0.2)):
        subs.append(_gang(at * d, name, pods, gpus, _finite(at * d, length * d, d)))
    for i in range(4):
        name = f"mig-batch-{i}"
        length = _finite(0.4 * d, 0.2 * d, d)
        subs.append(Submission(0.4 * d, name, f"MIG 1g.10gb, done after {_seconds(length)}", "pod",
                               (_mig_pod(name, "1g.10gb", duration_s=length),)))
    for i in range(4):
        name = f"batch-{i}"
        length = _finite(0.5 * d, 0.25 * d, d)
        subs.append(Submission(0.5 * d, name, f"8 GPUs, done after {_seconds(length)} (burst beyond the fleet)", "pod",
                               (_training_pod(name, 8, duration_s=length),)))
    subs.sort(key=lambda s: s.at_s)
    return subs


def timeline_workload(subs: list[Submission], services: tuple[InferenceService, ...] = INFERENCE) -> Workload:
    """The run's workload for FGD fragmentation: the whole-GPU pod shapes the timeline submits, one per pod, and one
    per inference Deployment. MIG pods are left out (FGD measures the free share of whole GPUs, which MIG instances
    cannot use), and so are pods no node could ever hold (more GPUs than a node has)."""
    counts: dict[Shape, int] = {}
    objects = [obj for sub in subs for obj in sub.objects] + [svc.deployment() for svc in services]
    for obj in objects:
        pod = obj if obj["kind"] == "Pod" else {"metadata": obj["metadata"], "spec": obj["spec"]["template"]["spec"]}
        demand = pod_demand(pod)
        if demand.gpus and not demand.mig_profile and demand.gpus <= MAX_GPUS_PER_NODE:
            shape = Shape.of(demand)
            counts[shape] = counts.get(shape, 0) + 1
    return Workload.of_shapes(counts.items())


# -- the trace, in compressed time -------------------------------------------------------------------------------------

def service_arrivals(trace: list[Arrival], svc: InferenceService, *, speed: float,
                     duration_s: float) -> list[Arrival]:
    """The arrivals `svc` replays, in wall seconds: the trace from `offset_s` on (wrapping around), each arrival
    `rate_scale` times, times divided by `speed`, up to `duration_s`."""
    if speed <= 0:
        raise ValueError(f"speed must be positive, got {speed}")
    span = trace[-1].t + 1.0
    rotated = sorted((Arrival((a.t - svc.offset_s) % span, a.context_tokens, a.generated_tokens) for a in trace),
                     key=lambda a: a.t)
    out = []
    for a in scale_rate(rotated, svc.rate_scale):
        t = a.t / speed
        if t > duration_s:
            break
        out.append(Arrival(t, a.context_tokens, a.generated_tokens))
    return out


def service_model(speed: float) -> ServiceModel:
    """The serving model of docs/autoscaling.md with trace time running `speed` times faster than the wall clock."""
    base = ServiceModel()
    return ServiceModel(concurrency=base.concurrency, prefill_tokens_per_s=base.prefill_tokens_per_s * speed,
                        decode_tokens_per_s=base.decode_tokens_per_s * speed, cold_start_s=base.cold_start_s / speed,
                        scrape_interval_s=scrape_interval_s(speed), slo_queue_wait_s=SLO_QUEUE_WAIT_S / speed,
                        max_waiting=base.max_waiting)


def scrape_interval_s(speed: float) -> float:
    """Prometheus's 15 s scrape in compressed time, no shorter than 1 s (a scrape costs the replayer a render)."""
    return max(1.0, TRACE_SCRAPE_S / speed)


def autoscaler_timing(speed: float) -> dict[str, Any]:
    """The autoscaler's period, cold start and rate windows in compressed time. A window spans at least 2.5 scrapes
    (a rate needs two samples in it, and scrapes jitter). It was 4: at the default speed 10 (1.5 s scrapes) that
    stretched the 30 s short rate window to 60 s of trace time, and the simulator, on the same windows
    (`--rate-windows 60,60,120`), loses 4.2 and 6.4 points of SLO attainment on the demo's two services; 2.5 scrapes
    (3.75 s, 37.5 s of trace time) costs nothing there at the default phase. The demo's comparison runs the simulator
    with these windows (gpuaas/demo/agreement.py)."""
    scrape = scrape_interval_s(speed)
    windows = {k: f"{round(1000 * max(v / speed, MIN_SCRAPES_PER_WINDOW * scrape))}ms"
               for k, v in TRACE_WINDOWS_S.items()}
    return {"interval_s": max(1.0, TRACE_SYNC_S / speed), "cold_start_s": ServiceModel().cold_start_s / speed,
            "windows": windows}
