"""`gpuaas report RUN_JSON [--out DIR]`: render the demo's report again from its run record."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..plotting import MatplotlibMissing
from . import write_report
from .model import RunRecordError, load_run_record


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("report", help="write the HTML report (with PNG plots) of a demo run record",
                                   description="Render the report of a `gpuaas demo` run again from its run.json: "
                                               "report.html and its PNG plots.")
    parser.add_argument("run_json", metavar="RUN_JSON", type=Path, help="the run.json that `gpuaas demo` wrote")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="directory for report.html and its plots (default: beside RUN_JSON)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
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
