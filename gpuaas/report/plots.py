"""The report's PNG plots, both schedulers on the same axes: matplotlib figures drawn off-screen (Agg).

matplotlib is imported when a plot is drawn, not when `gpuaas` builds its parser (it costs half a second). It is the
`plot` extra: without it `write_plots` raises gpuaas.plotting.MatplotlibMissing, which says what to install."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..plotting import require_matplotlib
from .model import DeploymentSample, Run, RunRecord, Sample

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# One colour per scheduler, the same in every plot.
COLORS = {"gpuaas": "#1f77b4", "default": "#ff7f0e"}
ARRIVAL_COLOR = "#7f7f7f"
SLO_COLOR = "#d62728"
DPI = 100
HEADROOM = 1.12
SYMLOG_ABOVE_SLO = 10  # queue waits past this multiple of the SLO switch the plot to a log scale above the SLO


@dataclass(frozen=True)
class Plot:
    filename: str
    title: str


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


@dataclass(frozen=True)
class TimeAxis:
    """The shared x axis: from the start of the run to its end (or the last sample), in seconds or minutes."""
    end_s: float
    minutes: bool

    @classmethod
    def of(cls, record: RunRecord) -> TimeAxis:
        last = max((r.samples[-1].t for r in record.runs.values() if r.samples), default=0.0)
        end = max(last, record.duration_s)
        return cls(end, end > 900)

    def values(self, run: Run) -> list[float]:
        return [s.t / 60 if self.minutes else s.t for s in run.samples]

    def apply(self, ax: Axes) -> None:
        ax.set_xlim(0, self.end_s / 60 if self.minutes else self.end_s)
        ax.set_xlabel("minutes since start" if self.minutes else "seconds since start")


def _sample_lines(ax: Axes, record: RunRecord, value: Callable[[Sample], float | None], time: TimeAxis,
                  what: str = "", **style) -> None:
    """One line per run: `value` of each sample (None leaves a gap)."""
    for run in record.ordered_runs():
        if run.samples:
            ax.plot(time.values(run), [_nan(value(s)) for s in run.samples], color=COLORS[run.scheduler],
                    label=f"{run.scheduler}{what}", **style)


def _deployment_line(ax: Axes, run: Run, name: str, value: Callable[[DeploymentSample], float | None],
                     time: TimeAxis, **style) -> list[float]:
    """Plot one Deployment's series from one run (nothing if the run never sampled it); the values plotted."""
    points = [(t, _nan(value(s.deployments[name]))) for t, s in zip(time.values(run), run.samples, strict=True)
              if name in s.deployments]
    if points:
        ax.plot([p[0] for p in points], [p[1] for p in points], **style)
    return [p[1] for p in points]


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


def _from_zero(ax: Axes) -> None:
    """y from 0 to a little above the highest value, so that a line at its maximum does not run along the frame."""
    top = ax.dataLim.y1
    ax.set_ylim(0, HEADROOM * top if math.isfinite(top) and top > 0 else 1)


def _integer_ticks(ax: Axes) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def plot_allocation(record: RunRecord, path: Path, time: TimeAxis) -> None:
    fig = _figure(6)
    ax, bx = fig.subplots(2, 1, sharex=True)
    _sample_lines(ax, record, lambda s: 100 * s.gpus_allocated / s.gpus_total if s.gpus_total else None, time)
    ax.set_ylabel("GPUs allocated (%)")
    ax.set_ylim(0, 105)
    ax.set_title("GPU allocation")
    ax.legend(loc="lower right")
    _sample_lines(bx, record, lambda s: None if s.fragmentation_ratio is None else 100 * s.fragmentation_ratio,
                  time)
    bx.set_ylabel("fragmentation (%)")
    _from_zero(bx)
    bx.set_title("GPU fragmentation (share of free GPU capacity the workload cannot use)")
    time.apply(bx)
    _save(fig, path)


def plot_nodes(record: RunRecord, path: Path, time: TimeAxis) -> None:
    fig = _figure(4)
    ax = fig.subplots()
    _sample_lines(ax, record, lambda s: s.nodes, time, ": Node objects", drawstyle="steps-post")
    _sample_lines(ax, record, lambda s: s.gpu_nodes_ready, time, ": GPU nodes ready", ls="--",
                  drawstyle="steps-post")
    ax.set_ylabel("nodes")
    _from_zero(ax)
    _integer_ticks(ax)
    time.apply(ax)
    ax.set_title("Nodes over time (solid: Node objects, dashed: GPU nodes ready)")
    ax.legend(loc="lower right")
    _save(fig, path)


def deployment_names(record: RunRecord) -> list[str]:
    """Every Deployment sampled in any run (a Deployment may be missing from one run)."""
    return sorted({name for run in record.runs.values() for s in run.samples for name in s.deployments})


def plot_replicas(record: RunRecord, path: Path, time: TimeAxis) -> None:
    names = deployment_names(record)
    fig = _figure(1.0 + 2.4 * len(names))
    axes = fig.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0]
    for ax, name in zip(axes, names, strict=True):
        rate_ax = ax.twinx()
        for run in record.ordered_runs():
            color = COLORS[run.scheduler]
            _deployment_line(ax, run, name, lambda d: d.replicas, time, color=color, drawstyle="steps-post",
                             label=f"{run.scheduler}: replicas")
            _deployment_line(rate_ax, run, name, lambda d: d.arrival_rate, time, color=ARRIVAL_COLOR,
                             ls=":" if run.scheduler == "default" else "-", lw=0.8,
                             label=f"arrival rate ({run.scheduler} run)")
        ax.set_ylabel("replicas")
        _from_zero(ax)
        _integer_ticks(ax)
        rate_ax.set_ylabel("requests/s", color=ARRIVAL_COLOR)
        _from_zero(rate_ax)
        ax.set_title(f"{name}: replicas against arrival rate")
        lines = ax.get_lines() + rate_ax.get_lines()
        ax.legend(lines, [line.get_label() for line in lines], loc="upper left", fontsize=7)
    time.apply(axes[-1])
    _save(fig, path)


def plot_queue_wait(record: RunRecord, path: Path, time: TimeAxis) -> None:
    names = deployment_names(record)
    fig = _figure(1.0 + 2.4 * len(names))
    axes = fig.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0]
    slo = record.slo_queue_wait_s
    for ax, name in zip(axes, names, strict=True):
        waits = []
        for run in record.ordered_runs():
            waits += _deployment_line(ax, run, name, lambda d: d.queue_wait_p99_s, time, color=COLORS[run.scheduler],
                                      label=run.scheduler)
        ax.axhline(slo, color=SLO_COLOR, ls="--", lw=1, label=f"SLO {slo:g} s")
        ax.set_ylabel("p99 queue wait (s)")
        if max((w for w in waits if not math.isnan(w)), default=0.0) > SYMLOG_ABOVE_SLO * slo:
            # Linear up to the SLO, logarithmic above: a backlog of minutes would flatten the SLO line otherwise.
            ax.set_yscale("symlog", linthresh=slo)
            ax.set_ylabel("p99 queue wait (s, log above the SLO)")
        _from_zero(ax)
        ax.set_title(f"{name}: queue wait p99 against the SLO")
        ax.legend(loc="upper left", fontsize=7)
    time.apply(axes[-1])
    _save(fig, path)


def write_plots(record: RunRecord, outdir: Path) -> list[Plot]:
    """Draw every plot the record has data for into `outdir`; the ones written, in the report's order. Raises
    MatplotlibMissing (naming the plot extra) when there is something to draw and matplotlib is not installed."""
    if not any(run.samples for run in record.runs.values()):
        return []
    require_matplotlib("drawing the report's plots")
    time = TimeAxis.of(record)
    plots = [(Plot("allocation.png", "GPU allocation and fragmentation over time"), plot_allocation),
             (Plot("nodes.png", "Nodes over time"), plot_nodes)]
    if deployment_names(record):
        plots += [(Plot("replicas.png", "Replicas against load, per Deployment"), plot_replicas),
                  (Plot("queue_wait.png", "Queue wait p99 against the SLO, per Deployment"), plot_queue_wait)]
    for plot, draw in plots:
        draw(record, outdir / plot.filename, time)
    return [plot for plot, _ in plots]
