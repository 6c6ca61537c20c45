"""`gpuaas report RUN_JSON [--out DIR]`: render the demo's report again from its run record.
`gpuaas report idle --prometheus URL ...`: the workloads holding GPUs they do not use (gpuaas/report/idle.py)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..plotting import MatplotlibMissing
from . import idle, write_report
from .model import RunRecordError, load_run_record


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("report", help="the HTML report of a demo run record; `report idle`: idle GPUs",
                                   description="`gpuaas report RUN_JSON`: render the report of a `gpuaas demo` run "
                                               "again from its run.json (report.html and its PNG plots). "
                                               "`gpuaas report idle --prometheus URL`: list the workloads that hold "
                                               "GPUs but used less than a threshold of them over a window, from "
                                               "dcgm-exporter's series (docs/autoscaling.md, Idle GPUs).")
    parser.add_argument("run_json", metavar="RUN_JSON|idle", type=Path,
                        help="the run.json that `gpuaas demo` wrote, or `idle`")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="directory for report.html and its plots (default: beside RUN_JSON)")
    idle.add_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if str(args.run_json) == "idle":
        return idle.run(args)
    try:
        record = load_run_record(args.run_json)
    except RunRecordError as err:
        print(f"gpuaas report: {err}", file=sys.stderr)
        return 2
    try:
        path = write_report(record, args.out or args.run_json.parent)
    except MatplotlibMissing as err:
        print(f"gpuaas report: {err}", file=sys.stderr)
        return 1
    print(path)
    return 0
