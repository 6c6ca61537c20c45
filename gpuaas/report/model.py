"""The demo's run record (`run.json`): the one home of its schema, shared by `gpuaas demo` and the report writer.

Times are seconds since the start of the run, in wall-clock (not trace) time. A record holds one run per scheduler
("gpuaas", and "default" for kube-scheduler's own scoring on the same workload timeline), each with its samples, its
events, the final state read from the apiserver and, optionally, the summary the demo computed.

What a sample's fields mean (the report's summary is computed from them, see gpuaas/report/summary.py):
- `gpus_total`, `gpus_allocated`: whole-GPU equivalents (a MIG slice counts as its fraction of a GPU);
  `allocation_ratio` must agree with them;
- `fragmentation_ratio`: scoring/fragmentation.py on the snapshot, against the run's workload;
- per Deployment: `arrival_rate` (requests/s arriving over the sample interval), `queue_wait_p99_s` and
  `slo_attainment` (the fraction of the requests that started in the sample interval after waiting no longer than the
  SLO) - None when there was nothing to measure.

Measured values may be None or NaN (read as None); counts, times and names are required and checked, and an unknown
field is refused so that a misspelt one never silently reads as missing. Fields may be added: keep them optional.
"""
from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from runtime.config import describe_errors

SCHEDULERS = ("gpuaas", "default")  # the order the report shows them in
# allocation_ratio is written rounded; this much disagreement with gpus_allocated / gpus_total is rounding.
RATIO_TOLERANCE = 0.01


class RunRecordError(ValueError):
    """A run record that cannot be reported; the message names the source and the field."""


def _nan_to_none(value: Any) -> Any:
    return None if isinstance(value, float) and math.isnan(value) else value


Count = Annotated[int, Field(ge=0)]
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
GPUs = Annotated[float, Field(ge=0, allow_inf_nan=False)]
# A measurement that may be missing: None or NaN (JSON from Python may carry NaN) both read as None.
Measured = Annotated[Annotated[float, Field(ge=0, allow_inf_nan=False)] | None, BeforeValidator(_nan_to_none)]
Fraction = Annotated[Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None, BeforeValidator(_nan_to_none)]


class _Record(BaseModel):
    # strict: a count given as "3" or true is a bug in the writer, not something to guess at.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Pool(_Record):
    name: str
    model: str
    gpus_per_node: Count
    nodes: Count  # at the start of the run
    mig: str | dict[str, int] | None = None  # MIG-manager config name or per-GPU layout, as in the pool spec
    group: bool = False  # a node group the node scaler may grow


class DeploymentSample(_Record):
    replicas: Count
    ready: Count | None = None
    arrival_rate: Measured = None
    queue_depth: Measured = None
    queue_wait_p99_s: Measured = None
    slo_attainment: Fraction = None


class Sample(_Record):
    t: Seconds
    nodes: Count
    gpu_nodes_ready: Count
    gpus_total: GPUs
    gpus_allocated: GPUs
    allocation_ratio: Fraction = None
    fragmentation_ratio: Fraction = None
    pods_running: Count
    pods_pending: Count
    pods_succeeded: Count
    deployments: dict[str, DeploymentSample] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> Sample:
        if self.gpus_allocated > self.gpus_total + 1e-9:
            raise ValueError(f"gpus_allocated {self.gpus_allocated:g} exceeds gpus_total {self.gpus_total:g}")
        if self.allocation_ratio is not None:
            expected = self.gpus_allocated / self.gpus_total if self.gpus_total else 0.0
            if abs(self.allocation_ratio - expected) > RATIO_TOLERANCE:
                raise ValueError(f"allocation_ratio {self.allocation_ratio:g} is not gpus_allocated / gpus_total "
                                 f"({expected:.4f})")
        return self


class Event(_Record):
    t: Seconds
    kind: str
    object: str
    message: str = ""


class PendingPod(_Record):
    pod: str
    reason: str
    request: str | None = None


class PlacedPod(_Record):
    pod: str
    node: str
    gpu: str | None = None
    request: str


class FinalGPUNode(_Record):
    """A GPU node at the end of the run; lets the report count whole nodes left free instead of trusting the demo."""
    name: str
    pool: str | None = None
    gpus_total: GPUs
    gpus_allocated: GPUs
    whole_gpus: Count  # allocatable nvidia.com/gpu: 0 on a node whose GPUs are all MIG-partitioned


class GangOutcome(_Record):
    """A gang at the end of the run: how long from its submission until every member was bound and running, and how
    long it was half-placed (some members bound, not all)."""
    gang: str
    size: Count
    members: Count
    bound: Count
    submitted: float | None = None  # epoch seconds of its first member's creation
    all_bound_after_s: Measured = None
    all_running_after_s: Measured = None
    half_placed_s: Measured = None


class Final(_Record):
    nodes: Count
    gpus_total: GPUs
    gpus_allocated: GPUs
    pods_running: Count
    pods_pending: Count
    pods_succeeded: Count
    replicas: dict[str, Count] = Field(default_factory=dict)
    pending: list[PendingPod] = Field(default_factory=list)
    placements: list[PlacedPod] = Field(default_factory=list)
    gpu_nodes: list[FinalGPUNode] | None = None
    gangs: list[GangOutcome] = Field(default_factory=list)


class Summary(_Record):
    mean_allocation_ratio: Fraction = None
    slo_attainment: Fraction = None
    gpu_node_hours: Measured = None
    whole_nodes_free_at_end: Count | None = None


class IdleWorkload(_Record):
    """A workload that held GPUs and used them less than the threshold over the window (scoring/idle.py)."""
    namespace: str
    kind: str
    name: str
    gpus: GPUs
    utilization: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
    gpu_hours: Seconds  # GPU-hours held idle over the window
    pods: list[str] = Field(default_factory=list)


class IdleSection(_Record):
    """`gpuaas report idle` at the end of the run, against the run's Prometheus (the simulated dcgm-exporter)."""
    threshold: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
    window_s: Seconds
    workloads: list[IdleWorkload] = Field(default_factory=list)
    busy: list[str] = Field(default_factory=list)  # judged and not idle: namespace/kind/name
    unmeasured: list[str] = Field(default_factory=list)  # pods holding GPUs without a sample
    error: str | None = None  # why there is no answer


class ReplicaRecord(_Record):
    """One pod of an inference Deployment as its load replayer saw it, in seconds since the run's start: listed
    (about when the ReplicaSet created it), bound to a node, serving (its cold start over), gone (not routed to)."""
    pod: str
    listed_s: Seconds
    bound_s: Measured = None
    serving_s: Measured = None
    gone_s: Measured = None


class GpuSample(_Record):
    """At a sample: the GPUs an inference Deployment's pods held, and the whole GPUs free in the cluster."""
    t: Seconds
    held: Count
    free: Count


class ServiceSLO(_Record):
    """One inference service: the SLO attainment the demo measured beside what `gpuaas simulate autoscaling` gives for
    the same trace window and policy (gpuaas/demo/agreement.py)."""
    demo: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
    demo_requests: Count
    simulated: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
    simulated_requests: Count
    initial_replicas: Count
    command: str
    simulated_low: Fraction = None  # the simulator's lowest and highest over scrape and controller phases
    simulated_high: Fraction = None
    replayed: Fraction = None  # the simulator's serving model on the demo's own replicas
    on_demo_gpus: Fraction = None  # the simulator limited to the GPUs the demo's cluster left the service
    on_demo_gpus_low: Fraction = None  # the same over scrape and controller phases
    on_demo_gpus_high: Fraction = None
    why: str = ""  # why the demo and the simulator are more than 3 points apart, from the measurements above
    replicas: list[ReplicaRecord] = Field(default_factory=list)
    gpus: list[GpuSample] = Field(default_factory=list)


class Run(_Record):
    scheduler: Literal["gpuaas", "default"]
    samples: list[Sample] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)
    final: Final | None = None  # None when the run ended before the final state could be read
    summary: Summary | None = None
    idle: IdleSection | None = None
    services: dict[str, ServiceSLO] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _time_ordered(self) -> Run:
        for i in range(1, len(self.samples)):
            if self.samples[i].t < self.samples[i - 1].t:
                raise ValueError(f"samples[{i}].t {self.samples[i].t:g} is before samples[{i - 1}].t "
                                 f"{self.samples[i - 1].t:g}: samples must be in time order")
        return self


class RunRecord(_Record):
    version: Literal[1] = 1
    started_at: Annotated[datetime, Field(strict=False)]  # ISO 8601 text in JSON
    duration_s: Seconds
    speed: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    slo_queue_wait_s: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    pools: list[Pool] = Field(default_factory=list)
    runs: dict[Literal["gpuaas", "default"], Run] = Field(min_length=1)

    @model_validator(mode="after")
    def _runs_named_by_scheduler(self) -> RunRecord:
        for key, run in self.runs.items():
            if run.scheduler != key:
                raise ValueError(f"runs.{key}.scheduler is {run.scheduler!r}, expected {key!r}")
        return self

    def ordered_runs(self) -> list[Run]:
        """The runs in the order the report shows them side by side: gpuaas first."""
        return [self.runs[s] for s in SCHEDULERS if s in self.runs]


def parse_run_record(data: Any, source: str | None = None) -> RunRecord:
    """Validate a decoded run record; RunRecordError names `source` (a file) and every bad field."""
    if isinstance(data, RunRecord):
        return data
    what = f"{source}: invalid run record" if source else "invalid run record"
    if not isinstance(data, dict):
        raise RunRecordError(f"{what}: expected a JSON object, got {type(data).__name__}")
    try:
        return RunRecord.model_validate(data)
    except ValidationError as err:
        raise RunRecordError(f"{what}: {describe_errors(err)}") from None


def load_run_record(path: Path | str) -> RunRecord:
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise RunRecordError(f"{path}: {err.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise RunRecordError(f"{path}: not valid JSON: {err}") from None
    return parse_run_record(data, str(path))
