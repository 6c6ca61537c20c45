"""`gpuaas loadgen`: replay a request trace against a Deployment's pods and serve their vLLM-style metrics (a tool
of the local demo and the autoscaling tests, not part of the autoscaler)."""
from __future__ import annotations

import argparse
import signal
import sys
import threading


def register(subparsers: argparse._SubParsersAction) -> None:
    g = subparsers.add_parser("loadgen", help="replay a request trace against a Deployment's pods, export metrics",
                              description="Drive simulated inference replicas, one per pod of a Deployment, from a "
                                          "request trace, and serve their vLLM-style metrics on /metrics.")
    g.add_argument("--kubeconfig")
    g.add_argument("--namespace", default="default")
    g.add_argument("--deployment", required=True)
    g.add_argument("--trace", required=True)
    g.add_argument("--rate-scale", type=int, default=1)
    g.add_argument("--port", type=int, default=9400)
    g.add_argument("--cold-start", type=float, default=60.0)
    g.add_argument("--concurrency", type=int, default=8)
    g.set_defaults(func=cmd_loadgen)


def cmd_loadgen(args: argparse.Namespace) -> int:
    from runtime.kubeclient import api_client

    from .replayer import Replayer
    from .serving import ServiceModel
    from .trace import TraceError, load_trace, scale_rate

    try:
        arrivals = scale_rate(load_trace(args.trace), args.rate_scale)
        model = ServiceModel(cold_start_s=args.cold_start, concurrency=args.concurrency)
    except (TraceError, ValueError, OSError) as exc:
        print(f"gpuaas loadgen: {exc}", file=sys.stderr)
        return 2
    replayer = Replayer(api_client(args.kubeconfig), args.namespace, args.deployment, arrivals, model=model,
                        port=args.port).start()
    print(f"replaying {len(arrivals)} requests; metrics on http://127.0.0.1:{replayer.port}/metrics", file=sys.stderr)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    replayer.stop()
    return 0
