"""`gpuaas extender`: serve kube-scheduler's extender verbs."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import uvloop
from aiohttp import web

from runtime.config import ConfigError, load_config
from runtime.logs import setup_logging

from .config import ENV_PREFIX, ExtenderConfig


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("extender", help="serve the kube-scheduler HTTP extender",
                              description="Serve filter/prioritize/bind for kube-scheduler. Settings come from "
                                          f"--config, then {ENV_PREFIX}* variables, then these flags.")
    p.add_argument("--config", type=Path, help="YAML/JSON settings file (fields of ExtenderConfig)")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    from scoring.policies import POLICIES

    p.add_argument("--policy", help=f"scoring policy ({', '.join(POLICIES)}; default gpuaas)")
    p.add_argument("--kubeconfig", type=Path, help="default: in-cluster service account")
    p.add_argument("--snapshot", type=Path, help="serve from a `kubectl get nodes,pods -A -o yaml` dump instead "
                                                 "of a live cluster")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from .server import handler_options, live_app, load_snapshot, snapshot_app, ssl_context, warm_up_once_synced

    try:
        config = load_config(ExtenderConfig, args.config, env_prefix=ENV_PREFIX, overrides={
            "host": args.host, "port": args.port, "policy": args.policy, "kubeconfig": args.kubeconfig,
            "snapshot": args.snapshot})
        app = snapshot_app(config, load_snapshot(config.snapshot)) if config.snapshot else live_app(config)
    except (ConfigError, ValueError) as err:
        print(f"gpuaas extender: {err}", file=sys.stderr)
        return 2
    setup_logging(config.log_level, config.log_format)
    warm_up_once_synced(app)
    # uvloop's event loop (libuv) handles the scheduler's request/response round trips with less overhead per request.
    web.run_app(app, host=config.host, port=config.port, ssl_context=ssl_context(config), print=None,
                access_log=None, loop=uvloop.new_event_loop(), **handler_options(config))
    return 0
