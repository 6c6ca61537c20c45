"""`gpuaas gangs`: place pod groups all or nothing (docs/gangs.md)."""
from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("gangs", help="gang controller and admission webhook: pod groups placed all or nothing",
                              description="Gate the members of pod groups at creation (admission webhook), plan "
                                          "each complete group on the live cluster, pin every member to its planned "
                                          "node and release them together; one leader at a time (docs/gangs.md).")
    p.add_argument("--config", help="YAML config (gangs/config.py documents the fields); default: all defaults")
    p.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then ~/.kube/config)")
    p.add_argument("--host", default="0.0.0.0", help="address of /metrics, /healthz, /readyz, /explain, /gangs")
    p.add_argument("--port", type=int, default=8091)
    p.add_argument("--identity", help="leader-election identity (default: $POD_NAME or hostname, plus a random suffix)")
    p.add_argument("--log-format", choices=("json", "text"), help="default: the config's log_format (json)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_gangs)


def cmd_gangs(args: argparse.Namespace) -> int:
    from runtime.config import ConfigError
    from runtime.lifecycle import run_until_signalled
    from runtime.logs import setup_logging

    from .config import load_gangs_config
    from .service import Service

    try:
        config = load_gangs_config(args.config)
    except ConfigError as exc:
        print(f"gpuaas gangs: refusing to start:\n{exc}", file=sys.stderr)
        return 2
    setup_logging("DEBUG" if args.verbose else "INFO", args.log_format or config.log_format)

    service = Service(config, args.kubeconfig, identity=args.identity)
    run_until_signalled(lambda stop: service.run(args.host, args.port, stop))
    return 0
