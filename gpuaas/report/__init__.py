"""The demo's report: PNG plots and one HTML page comparing the gpuaas run with kube-scheduler's default scoring.

    write_report(run, outdir) -> outdir/report.html (plots beside it)

`run` is the run record (a dict as in run.json, or a RunRecord); see gpuaas/report/model.py for its schema.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .html import render_html
from .model import RunRecord, RunRecordError, load_run_record, parse_run_record
from .plots import write_plots
from .summary import compute_summary

__all__ = ["RunRecord", "RunRecordError", "compute_summary", "load_run_record", "parse_run_record", "write_report"]

REPORT_FILENAME = "report.html"


def write_report(run: dict[str, Any] | RunRecord, outdir: Path) -> Path:
    """Validate `run` (RunRecordError names a bad field), write the plots and the page into `outdir`; its path."""
    record = parse_run_record(run)
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    plots = write_plots(record, outdir)
    path = outdir / REPORT_FILENAME
    path.write_text(render_html(record, plots), encoding="utf-8")
    return path
