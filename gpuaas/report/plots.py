"""The report's PNG plots, both schedulers on the same axes: matplotlib figures drawn off-screen (Agg).

matplotlib is imported when a plot is drawn, not when `gpuaas` builds its parser (it costs half a second)."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .model import DeploymentSample, Run, RunRecord, Sample

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# One colour per scheduler, the same in every plot.
COLORS = {"gpuaas": "#1f77b4", "default": "#ff7f0e"}
ARRIVAL_COLOR = "#7f7f7f"
SLO_COLOR = "#d62728"
DPI = 100


@dataclass(frozen=True)
class Plot:
    filename: str
    title: str


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def _minutes(record: RunRecord) -> bool:
    """Minutes on the time axis for long runs, seconds for short ones."""
    last = max((r.samples[-1].t for r in record.runs.values() if r.samples), default=0.0)
    return max(last, record.duration_s) > 900


def _times(run: Run, minutes: bool) -> list[float]:
    return [s.t / 60 if minutes else s.t for s in run.samples]


def _sample_lines(ax: Axes, record: RunRecord, value: Callable[[Sample], float | None], minutes: bool,
                  what: str = "", **style) -> None:
    """One line per run: `value` of each sample (None leaves a gap)."""
    for run in record.ordered_runs():
        if run.samples:
            ax.plot(_times(run, minutes), [_nan(value(s)) for s in run.samples], color=COLORS[run.scheduler],
                    label=f"{run.scheduler}{what}", **style)


def _deployment_line(ax: Axes, run: Run, name: str, value: Callable[[DeploymentSample], float | None],
                     minutes: bool, **style) -> bool:
    """Plot one Deployment's series from one run; False when the run never sampled that Deployment."""
    points = [(t, _nan(value(s.deployments[name]))) for t, s in zip(_times(run, minutes), run.samples)
              if name in s.deployments]
    if not points:
        return False
    ax.plot([p[0] for p in points], [p[1] for p in points], **style)
    return True


def _figure(height: float) -> Figure:
    # A bare Figure on an Agg canvas: no pyplot, so no global backend switch and no figure registry to leak into.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, height))
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)


def _time_label(minutes: bool) -> str:
    return "minutes since start" if minutes else "seconds since start"


def plot_allocation(record: RunRecord, path: Path, minutes: bool) -> None:
    fig = _figure(6)
    ax, bx = fig.subplots(2, 1, sharex=True)
    _sample_lines(ax, record, lambda s: 100 * s.gpus_allocated / s.gpus_total if s.gpus_total else None, minutes)
    ax.set_ylabel("GPUs allocated (%)")
    ax.set_ylim(0, 105)
    ax.set_title("GPU allocation")
    ax.legend(loc="lower right")
    _sample_lines(bx, record, lambda s: None if s.fragmentation_ratio is None else 100 * s.fragmentation_ratio,
                  minutes)
    bx.set_ylabel("fragmentation (%)")
    bx.set_ylim(bottom=0)
    bx.set_title("GPU fragmentation (share of free GPU capacity the workload cannot use)")
    bx.set_xlabel(_time_label(minutes))
    _save(fig, path)


def plot_nodes(record: RunRecord, path: Path, minutes: bool) -> None:
    fig = _figure(4)
    ax = fig.subplots()
    _sample_lines(ax, record, lambda s: s.nodes, minutes, ": Node objects", drawstyle="steps-post")
    _sample_lines(ax, record, lambda s: s.gpu_nodes_ready, minutes, ": GPU nodes ready", ls="--",
                  drawstyle="steps-post")
    ax.set_ylabel("nodes")
    ax.set_ylim(bottom=0)
    ax.set_xlabel(_time_label(minutes))
    ax.set_title("Nodes over time (solid: Node objects, dashed: GPU nodes ready)")
    ax.legend(loc="lower right")
    _save(fig, path)


def deployment_names(record: RunRecord) -> list[str]:
    """Every Deployment sampled in any run (a Deployment may be missing from one run)."""
    return sorted({name for run in record.runs.values() for s in run.samples for name in s.deployments})


def plot_replicas(record: RunRecord, path: Path, minutes: bool) -> None:
    names = deployment_names(record)
    fig = _figure(1.0 + 2.4 * len(names))
    axes = fig.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0]
    for ax, name in zip(axes, names):
        rate_ax = ax.twinx()
        for run in record.ordered_runs():
            color = COLORS[run.scheduler]
            _deployment_line(ax, run, name, lambda d: d.replicas, minutes, color=color, drawstyle="steps-post",
                             label=f"{run.scheduler}: replicas")
            _deployment_line(rate_ax, run, name, lambda d: d.arrival_rate, minutes, color=ARRIVAL_COLOR,
                             ls=":" if run.scheduler == "default" else "-", lw=0.8,
                             label=f"arrival rate ({run.scheduler} run)")
        ax.set_ylabel("replicas")
        ax.set_ylim(bottom=0)
        rate_ax.set_ylabel("requests/s", color=ARRIVAL_COLOR)
        rate_ax.set_ylim(bottom=0)
        ax.set_title(f"{name}: replicas against arrival rate")
        lines = ax.get_lines() + rate_ax.get_lines()
        ax.legend(lines, [line.get_label() for line in lines], loc="upper left", fontsize=7)
    axes[-1].set_xlabel(_time_label(minutes))
    _save(fig, path)


def plot_queue_wait(record: RunRecord, path: Path, minutes: bool) -> None:
    names = deployment_names(record)
    fig = _figure(1.0 + 2.4 * len(names))
    axes = fig.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0]
    for ax, name in zip(axes, names):
        for run in record.ordered_runs():
            _deployment_line(ax, run, name, lambda d: d.queue_wait_p99_s, minutes, color=COLORS[run.scheduler],
                             label=run.scheduler)
        ax.axhline(record.slo_queue_wait_s, color=SLO_COLOR, ls="--", lw=1,
                   label=f"SLO {record.slo_queue_wait_s:g} s")
        ax.set_ylabel("p99 queue wait (s)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{name}: queue wait p99 against the SLO")
        ax.legend(loc="upper left", fontsize=7)
    axes[-1].set_xlabel(_time_label(minutes))
    _save(fig, path)


def write_plots(record: RunRecord, outdir: Path) -> list[Plot]:
    """Draw every plot the record has data for into `outdir`; the ones written, in the report's order."""
    if not any(run.samples for run in record.runs.values()):
        return []
    minutes = _minutes(record)
    plots = [(Plot("allocation.png", "GPU allocation and fragmentation over time"), plot_allocation),
             (Plot("nodes.png", "Nodes over time"), plot_nodes)]
    if deployment_names(record):
        plots += [(Plot("replicas.png", "Replicas against load, per Deployment"), plot_replicas),
                  (Plot("queue_wait.png", "Queue wait p99 against the SLO, per Deployment"), plot_queue_wait)]
    for plot, draw in plots:
        draw(record, outdir / plot.filename, minutes)
    return [plot for plot, _ in plots]
