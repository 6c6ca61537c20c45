"""`gpuaas report idle`: the workloads holding GPUs they did not use, read now from Prometheus (dcgm-exporter's series)
and Kubernetes; the same look the autoscaler takes for its gauges and events (autoscaler/idle.py, scoring/idle.py).

    gpuaas report idle --prometheus http://prometheus:9090 [--window 1h] [--threshold 0.05] [--min-age 10m]
                       [--namespace NS] [--kubeconfig FILE] [--json]
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import Any

from scoring.idle import IdleReport

from .model import IdleSection, IdleWorkload

DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(s|m|h|d)?$")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> float:
    """'90s', '15m', '1h', '2d' or plain seconds; argparse reports a bad one with the option's name."""
    m = DURATION.match(text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 90s, 15m or 1h")
    return float(m.group(1)) * UNITS[m.group(2) or "s"]


def section(report: IdleReport) -> IdleSection:
    """The report as the run record keeps it."""
    return IdleSection(
        threshold=report.threshold, window_s=report.window_s,
        workloads=[IdleWorkload(namespace=w.workload.namespace, kind=w.workload.kind, name=w.workload.name,
                                gpus=w.gpus, utilization=w.utilization, gpu_hours=w.gpu_hours,
                                pods=[u.pod for u in w.pods]) for w in report.idle],
        busy=[str(w.workload) for w in report.workloads if not w.idle],
        unmeasured=[f"{u.namespace}/{u.pod}" for _, u in report.unmeasured])


def as_json(report: IdleReport) -> dict[str, Any]:
    out = section(report).model_dump()
    out["idle_gpu_hours"] = report.idle_gpu_hours
    out["too_new"] = [f"{u.namespace}/{u.pod}" for _, u in report.too_new]
    return out


def _span(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def format_text(report: IdleReport, min_age_s: float) -> str:
    lines = [f"idle GPUs: workloads using less than {100 * report.threshold:g}% of their GPUs over the last "
             f"{_span(report.window_s)}"]
    if report.idle:
        rows = [(str(w.workload), f"{w.gpus:g}", f"{100 * w.utilization:.1f}%", f"{w.gpu_hours:.2f}",
                 ", ".join(u.pod for u in w.pods)) for w in report.idle]
        head = ("WORKLOAD", "GPUS", "USE", "IDLE GPU-H", "PODS")
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
        for r in [head, *rows]:
            lines.append("  ".join(c.ljust(widths[i]) if i in (0,) else c.rjust(widths[i]) if i < 4 else c
                                   for i, c in enumerate(r)))
        lines.append(f"total: {len(report.idle)} workload(s), {sum(w.gpus for w in report.idle):g} GPU(s), "
                     f"{report.idle_gpu_hours:.2f} GPU-hours held idle")
    else:
        lines.append("none")
    busy = [w for w in report.workloads if not w.idle]
    if busy:
        lines.append("busy: " + ", ".join(f"{w.workload} ({100 * w.utilization:.0f}%)" for w in busy))
    if report.unmeasured:
        lines.append("no dcgm-exporter series (not judged): " + ", ".join(
            f"{u.namespace}/{u.pod} ({u.gpus:g} GPU)" for _, u in report.unmeasured))
    if report.too_new:
        lines.append(f"started less than {_span(min_age_s)} ago (not judged): " + ", ".join(
            f"{u.namespace}/{u.pod}" for _, u in report.too_new))
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("gpuaas report idle")
    g.add_argument("--prometheus", metavar="URL", help="the Prometheus that scrapes dcgm-exporter (required)")
    g.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then ~/.kube/config)")
    g.add_argument("--namespace", help="only this namespace (default: all)")
    g.add_argument("--window", type=duration, default=3600.0, help="the window use is averaged over (default 1h)")
    g.add_argument("--threshold", type=float, default=0.05,
                   help="a workload using less than this share (0..1) of its GPUs is idle (default 0.05)")
    g.add_argument("--min-age", type=duration, default=600.0,
                   help="pods that started less than this long ago are not judged (default 10m)")
    g.add_argument("--json", action="store_true", help="print JSON instead of a table")


def run(args: argparse.Namespace) -> int:
    from kubernetes.client.rest import ApiException

    from autoscaler.config import IdleGpusConfig, PrometheusConfig
    from autoscaler.controller import kube_api
    from autoscaler.idle import KubeWorkloads, measure
    from autoscaler.prom import MetricsError, Prometheus
    from runtime.config import ConfigError, validate

    if not args.prometheus:
        print("gpuaas report idle: --prometheus URL is required (the Prometheus that scrapes dcgm-exporter)",
              file=sys.stderr)
        return 2
    try:
        prom_config = validate(PrometheusConfig, {"url": args.prometheus}, "--prometheus")
        config = validate(IdleGpusConfig, {"window_s": args.window, "threshold": args.threshold,
                                           "min_age_s": args.min_age}, "options")
        api = kube_api(args.kubeconfig)
    except ConfigError as exc:
        print(f"gpuaas report idle: {exc}", file=sys.stderr)
        return 2
    prom = Prometheus(prom_config.url, timeout_s=prom_config.timeout_s)
    try:
        report = measure(prom, KubeWorkloads(api, namespace=args.namespace), config, time.time())
    except MetricsError as exc:
        print(f"gpuaas report idle: {exc}", file=sys.stderr)
        return 1
    except ApiException as exc:
        print(f"gpuaas report idle: reading pods and their owners: {exc.status} {exc.reason}", file=sys.stderr)
        return 1
    finally:
        prom.close()
    print(json.dumps(as_json(report), indent=2) if args.json else format_text(report, config.min_age_s))
    return 0
