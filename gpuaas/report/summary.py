"""A run's summary computed from its samples and final state, and checked against the summary the demo recorded.

- mean_allocation_ratio: the mean over samples (taken at a fixed interval) of gpus_allocated / gpus_total, skipping
  samples with no GPUs;
- slo_attainment: the fraction of requests that waited no longer than the SLO, over all Deployments: each sample's
  per-Deployment attainment weighted by the requests it stands for (arrival_rate times the time since the previous
  sample, or since the start for the first);
- gpu_node_hours: GPU nodes ready, integrated over wall-clock time (each sample's count held until the next sample);
- whole_nodes_free_at_end: GPU nodes with whole GPUs (not all MIG) and nothing allocated, from final.gpu_nodes.

A writer should fill in the record's summary with `compute_summary`; a disagreement then means the record was changed
or computed some other way, and the report shows both numbers.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from .model import Final, Run, Summary

# How far a recorded figure may be from the computed one and still agree (rounding in the writer).
TOLERANCE = {"mean_allocation_ratio": 0.005, "slo_attainment": 0.005, "gpu_node_hours": 0.01,
             "whole_nodes_free_at_end": 0}
GPU_NODE_HOURS_RELATIVE_TOLERANCE = 0.02


def mean_allocation_ratio(run: Run) -> float | None:
    ratios = [s.gpus_allocated / s.gpus_total for s in run.samples if s.gpus_total > 0]
    return sum(ratios) / len(ratios) if ratios else None


def slo_attainment(run: Run) -> float | None:
    met = weight = 0.0
    previous_t = 0.0
    for s in run.samples:
        interval = s.t - previous_t
        previous_t = s.t
        for d in s.deployments.values():
            if d.slo_attainment is None or d.arrival_rate is None:
                continue
            requests = d.arrival_rate * interval
            met += d.slo_attainment * requests
            weight += requests
    return met / weight if weight > 0 else None


def gpu_node_hours(run: Run) -> float | None:
    if not run.samples:
        return None
    seconds = sum(a.gpu_nodes_ready * (b.t - a.t) for a, b in itertools.pairwise(run.samples))
    return seconds / 3600


def whole_gpu_nodes(final: Final | None) -> list[str] | None:
    """Names of the GPU nodes that can take whole-GPU pods at the end; None when the record does not list nodes."""
    if final is None or final.gpu_nodes is None:
        return None
    return [n.name for n in final.gpu_nodes if n.whole_gpus > 0]


def free_whole_gpu_nodes(final: Final) -> list[str]:
    """Whole-GPU nodes with nothing allocated: where the next 8-GPU job can go."""
    return [n.name for n in final.gpu_nodes or () if n.whole_gpus > 0 and n.gpus_allocated == 0]


def whole_nodes_free_at_end(final: Final | None) -> int | None:
    if final is None or final.gpu_nodes is None:
        return None
    return len(free_whole_gpu_nodes(final))


def compute_summary(run: Run) -> Summary:
    return Summary(mean_allocation_ratio=mean_allocation_ratio(run), slo_attainment=slo_attainment(run),
                   gpu_node_hours=gpu_node_hours(run), whole_nodes_free_at_end=whole_nodes_free_at_end(run.final))


@dataclass(frozen=True)
class SummaryFigure:
    """One summary number of a run: what the samples give, what the record says, and which of them to show."""
    name: str
    computed: float | None
    recorded: float | None

    @property
    def agrees(self) -> bool | None:
        """None when there is nothing to compare."""
        if self.computed is None or self.recorded is None:
            return None
        allowed = TOLERANCE[self.name]
        if self.name == "gpu_node_hours":
            allowed = max(allowed, GPU_NODE_HOURS_RELATIVE_TOLERANCE * abs(self.computed))
        return abs(self.computed - self.recorded) <= allowed + 1e-12

    @property
    def shown(self) -> float | None:
        return self.recorded if self.recorded is not None else self.computed


def summary_figures(run: Run) -> list[SummaryFigure]:
    computed = compute_summary(run)
    recorded = run.summary or Summary()
    return [SummaryFigure(name, getattr(computed, name), getattr(recorded, name)) for name in TOLERANCE]
