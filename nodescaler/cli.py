"""`gpuaas nodescaler`: grow GPU node groups for unschedulable pods, drain and remove idle GPU nodes
(docs/node-autoscaling.md). The harness's `--fake-node-agent` is added to this verb by the gpuaas layer
(gpuaas/cluster/cli.py), so that the component never imports the harness."""
from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("nodescaler", help="GPU node-group autoscaler: scale-out, MIG repartition, safe scale-in",
                              description="Grow GPU node groups for unschedulable pods (repartitioning idle MIG GPUs "
                                          "first), drain and remove idle GPU nodes through the Eviction API, one "
                                          "leader at a time (see docs/node-autoscaling.md).")
    p.add_argument("--config", required=True, help="YAML config (nodescaler/config.py documents the fields)")
    p.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then ~/.kube/config)")
    p.add_argument("--host", default="0.0.0.0", help="address of /metrics, /healthz, /readyz")
    p.add_argument("--port", type=int, default=8090)
    p.add_argument("--identity", help="leader-election identity (default: $POD_NAME or hostname, plus a random suffix)")
    p.add_argument("--dry-run", action="store_true", help="decide and log, never change the cluster")
    p.add_argument("--log-format", choices=("json", "text"), default="json")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_nodescaler)


def cmd_nodescaler(args: argparse.Namespace) -> int:
    from runtime.config import ConfigError
    from runtime.lifecycle import run_until_signalled
    from runtime.logs import setup_logging

    from .config import load_nodescaler_config
    from .service import Service

    setup_logging("DEBUG" if args.verbose else "INFO", args.log_format)
    try:
        config = load_nodescaler_config(args.config, overrides={"dry_run": True if args.dry_run else None})
    except ConfigError as exc:
        print(f"gpuaas nodescaler: refusing to start:\n{exc}", file=sys.stderr)
        return 2

    service = Service(config, args.kubeconfig, identity=args.identity)
    run_until_signalled(lambda stop: service.run(args.host, args.port, stop))
    return 0
