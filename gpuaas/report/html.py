"""The report page: one self-contained HTML file (inline style, plots as PNG files beside it).

Every string that comes from the record (names, reasons, messages: text the cluster wrote) is escaped; only the markup
built here is written raw, marked by the `Html` type.
"""
from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

from .model import Final, Run, RunRecord
from .plots import Plot
from .summary import SummaryFigure, free_whole_gpu_nodes, summary_figures, whole_gpu_nodes

STYLE = """
body { font-family: sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.warn { color: #b00020; }
.note { color: #666; font-size: 0.9em; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0 1.5em; }
"""

FIGURE_LABELS = {
    "mean_allocation_ratio": "mean GPU allocation",
    "slo_attainment": "SLO attainment (queue wait)",
    "gpu_node_hours": "GPU-node-hours (wall clock)",
    "whole_nodes_free_at_end": "whole-GPU nodes free at end",
}


class Html(str):
    """Markup built by this module: written as is, where any other str is escaped."""


def _text(value: object) -> Html:
    return value if isinstance(value, Html) else Html(html.escape(str(value)))


def _table(headers: Sequence[object], rows: Iterable[Sequence[object]], numeric_from: int | None = None) -> Html:
    """A table; columns from `numeric_from` on are right-aligned numbers."""
    head = "".join(f"<th>{_text(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td{' class=num' if numeric_from is not None and i >= numeric_from else ''}>{_text(c)}</td>"
                         for i, c in enumerate(row)) + "</tr>\n" for row in rows)
    return Html(f"<table><tr>{head}</tr>\n{body}</table>\n")


def format_figure(name: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    if name == "mean_allocation_ratio":
        return f"{100 * value:.1f}%"
    if name == "slo_attainment":
        return f"{100 * value:.2f}%"
    if name == "gpu_node_hours":
        return f"{value:.2f}"
    return f"{value:.0f}"


def _figure_cell(figure: SummaryFigure, run: Run) -> Html:
    shown = _text(format_figure(figure.name, figure.shown))
    if figure.name == "whole_nodes_free_at_end" and figure.shown is not None:
        whole = whole_gpu_nodes(run.final)
        if whole is not None:
            shown = Html(f"{shown} of {len(whole)}")
    if figure.agrees is False:
        return Html(f"{shown} <span class=warn>(recorded; computed from the run: "
                    f"{_text(format_figure(figure.name, figure.computed))})</span>")
    if figure.recorded is not None and figure.computed is None:
        return Html(f"{shown} <span class=note>(as recorded; not in the samples to check)</span>")
    return shown


def summary_section(record: RunRecord) -> Html:
    runs = record.ordered_runs()
    figures = {run.scheduler: summary_figures(run) for run in runs}
    rows = []
    for i, name in enumerate(FIGURE_LABELS):
        rows.append([FIGURE_LABELS[name], *(_figure_cell(figures[run.scheduler][i], run) for run in runs)])
    out = Html("<h2>Summary</h2>\n" + _table(["", *(r.scheduler for r in runs)], rows, numeric_from=1))
    if "default" not in record.runs:
        out = Html(out + "<p class=note>This record has no run with kube-scheduler's default scoring to compare "
                         "with.</p>\n")
    return Html(out + "<p class=note>Mean allocation over the samples; SLO attainment is the share of requests "
                      f"that waited at most {record.slo_queue_wait_s:g} s, over all Deployments; GPU-node-hours "
                      "count GPU nodes ready over the run's wall-clock time.</p>\n")


def _final_rows(final: Final | None) -> list[object]:
    if final is None:
        return ["not recorded"] * 5
    return [final.nodes, f"{final.gpus_allocated:g} of {final.gpus_total:g}", final.pods_running,
            final.pods_pending, final.pods_succeeded]


def _free_nodes(final: Final | None) -> str:
    if final is None or final.gpu_nodes is None:
        return "-"
    return ", ".join(free_whole_gpu_nodes(final)) or "none"


def final_section(record: RunRecord) -> Html:
    runs = record.ordered_runs()
    labels = ["nodes", "GPUs allocated", "pods running", "pods pending", "pods succeeded"]
    columns = [_final_rows(run.final) for run in runs]
    rows = [[label, *(col[i] for col in columns)] for i, label in enumerate(labels)]
    deployments = sorted({d for run in runs if run.final for d in run.final.replicas})
    rows += [[f"replicas {d}", *(run.final.replicas.get(d, "-") if run.final else "-" for run in runs)]
             for d in deployments]
    if any(run.final and run.final.gpu_nodes is not None for run in runs):
        rows.append(["whole-GPU nodes free", *(_free_nodes(run.final) for run in runs)])
    out = "<h2>State at the end</h2>\n<p class=note>Read from the apiserver at the end of each run.</p>\n"
    out += _table(["", *(r.scheduler for r in runs)], rows, numeric_from=1)
    for run in runs:
        if run.final is None:
            continue
        if run.final.gangs:
            out += f"<h3>{_text(run.scheduler)}: gangs ({len(run.final.gangs)})</h3>\n"
            out += _table(["gang", "pods", "bound", "all bound after (s)", "all running after (s)",
                           "half-placed (s)"],
                          ([g.gang, g.size, g.bound, _seconds(g.all_bound_after_s), _seconds(g.all_running_after_s),
                            _seconds(g.half_placed_s)] for g in run.final.gangs), numeric_from=1)
        out += f"<h3>{_text(run.scheduler)}: pending pods ({len(run.final.pending)})</h3>\n"
        if run.final.pending:
            out += _table(["pod", "request", "reason"], ([p.pod, p.request or "", p.reason] for p in run.final.pending))
        out += f"<h3>{_text(run.scheduler)}: placements ({len(run.final.placements)})</h3>\n"
        if run.final.placements:
            out += _table(["pod", "node", "GPU", "request"],
                          ([p.pod, p.node, p.gpu or "-", p.request] for p in run.final.placements))
    return Html(out)


def services_section(record: RunRecord) -> Html:
    runs = [run for run in record.ordered_runs() if run.services]
    if not runs:
        return Html("")

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.2f}%"

    rows = []
    for run in runs:
        for name, s in run.services.items():
            gap = 100 * (s.demo - s.simulated)
            phases = "-" if s.simulated_low is None else f"{pct(s.simulated_low)}-{pct(s.simulated_high)}"
            gpus = pct(s.on_demo_gpus) + ("" if s.on_demo_gpus_low is None else
                                          f" ({pct(s.on_demo_gpus_low)}-{pct(s.on_demo_gpus_high)})")
            rows.append([run.scheduler, name, pct(s.demo), s.demo_requests, pct(s.simulated), s.simulated_requests,
                         f"{gap:+.2f}", phases, pct(s.replayed), gpus, s.initial_replicas])
    commands = {n: s.command for run in runs for n, s in run.services.items()}
    out = ("<h2>SLO attainment per service: the demo and the simulator</h2>\n"
           + _table(["run", "service", "demo", "requests", "simulated", "requests", "points",
                     "simulated over phases", "demo's replicas", "demo's GPUs", "replicas at start"],
                    rows, numeric_from=2)
           + "<p class=note>The simulator: ours on the same trace window, from the same warm start, with the demo's "
             "rate windows and no memory of load before it (the demo's controller starts with the run): "
           + "; ".join(f"{_text(n)}: <code>{_text(c)}</code>" for n, c in commands.items())
           + ". Over phases: the same over a grid of Prometheus scrape and controller sync phases, which a real pair "
             "has in no particular order. Demo's replicas: the simulator's serving model on the replicas the demo had, "
             "when they served and went. Demo's GPUs: the simulator limited to the GPUs the demo's cluster left the "
             "service, at the default phase (over the phases). docs/demo.md has the measurements.</p>\n")
    for run in runs:
        for name, s in run.services.items():
            if s.why:
                out += f"<p class=warn>{_text(run.scheduler)} {_text(name)}: {_text(s.why)}</p>\n"
    return Html(out)


def idle_section(record: RunRecord) -> Html:
    runs = [run for run in record.ordered_runs() if run.idle is not None]
    if not runs:
        return Html("")
    out = "<h2>Idle GPUs</h2>\n"
    for run in runs:
        idle = run.idle
        assert idle is not None
        out += (f"<h3>{_text(run.scheduler)}: {len(idle.workloads)} workload(s) below "
                f"{100 * idle.threshold:g}% use over the last {idle.window_s:g} s</h3>\n")
        if idle.error:
            out += f"<p class=warn>{_text(idle.error)}</p>\n"
        if idle.workloads:
            out += _table(["workload", "GPUs", "use", "GPU-hours held idle", "pods"],
                          ([f"{w.namespace}/{w.kind}/{w.name}", f"{w.gpus:g}", f"{100 * w.utilization:.1f}%",
                            f"{w.gpu_hours:.3f}", ", ".join(w.pods)] for w in idle.workloads), numeric_from=1)
        out += (f"<p class=note>Busy ({len(idle.busy)}): {_text(', '.join(idle.busy) or 'none')}. Without a "
                f"dcgm-exporter series ({len(idle.unmeasured)}): {_text(', '.join(idle.unmeasured) or 'none')}. "
                "Use: per pod the larger of DCGM_FI_DEV_GPU_UTIL / 100 and DCGM_FI_PROF_GR_ENGINE_ACTIVE over the "
                "window, GPU-weighted per workload; times are wall-clock.</p>\n")
    return Html(out)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def events_section(record: RunRecord) -> Html:
    out = "<h2>Events</h2>\n<p class=note>From the autoscaler, the node scaler and the gang controller.</p>\n"
    for run in record.ordered_runs():
        out += f"<h3>{_text(run.scheduler)} ({len(run.events)})</h3>\n"
        if run.events:
            out += _table(["t (s)", "kind", "object", "message"],
                          ([f"{e.t:.1f}", e.kind, e.object, e.message] for e in run.events))
    return Html(out)


def plots_section(plots: list[Plot]) -> Html:
    if not plots:
        return Html("<h2>Plots</h2>\n<p>No samples were recorded, so there is nothing to plot.</p>\n")
    return Html("<h2>Plots</h2>\n" + "".join(
        f"<h3>{_text(p.title)}</h3>\n<img src=\"{_text(p.filename)}\" alt=\"{_text(p.title)}\">\n" for p in plots))


def _mig(mig: str | dict[str, int] | None) -> str:
    if isinstance(mig, dict):
        return ", ".join(f"{profile} x{count}" for profile, count in mig.items())
    return mig or "-"


def header_section(record: RunRecord) -> Html:
    facts = [["started", record.started_at.isoformat()], ["duration", f"{record.duration_s:g} s"],
             ["speed", f"{record.speed:g}x"], ["queue wait SLO", f"{record.slo_queue_wait_s:g} s"],
             ["samples", ", ".join(f"{r.scheduler}: {len(r.samples)}" for r in record.ordered_runs())]]
    out = "<h1>gpuaas demo report</h1>\n" + _table(["run", ""], facts)
    if record.pools:
        out += "<h2>GPU pools</h2>\n" + _table(
            ["pool", "GPU", "GPUs per node", "nodes at start", "MIG", "node group"],
            ([p.name, p.model, p.gpus_per_node, p.nodes, _mig(p.mig), "yes" if p.group else "no"]
             for p in record.pools))
    return Html(out)


def render_html(record: RunRecord, plots: list[Plot]) -> str:
    body = (header_section(record) + summary_section(record) + services_section(record) + plots_section(plots)
            + final_section(record) + idle_section(record) + events_section(record))
    return (f"<!DOCTYPE html>\n<html lang=en>\n<head>\n<meta charset=utf-8>\n<title>gpuaas demo report</title>\n"
            f"<style>{STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n")
