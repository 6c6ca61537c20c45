"""`gpuaas autoscaler` (the controller) and `gpuaas metrics-api` (custom.metrics.k8s.io for the HPA). The tools around
them are verbs of the gpuaas layer: `gpuaas loadgen` (gpuaas/loadgen/cli.py), `gpuaas simulate autoscaling`
(gpuaas/simulate/autoscaling_cli.py)."""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("autoscaler", help="scale inference Deployments on queue depth and arrival rate",
                              description="Scale the Deployments of a config file on queue depth and arrival rate "
                                          "read from Prometheus (see docs/autoscaling.md).")
    p.add_argument("--config", required=True, help="YAML config (autoscaler/config.py documents the fields)")
    p.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then ~/.kube/config)")
    p.add_argument("--dry-run", action="store_true", help="decide and record events, never change a replica count")
    p.add_argument("--once", action="store_true",
                   help="one sync of every target, then exit (only with the leader-election Lease: free, ours, or "
                        "expired within one lease duration)")
    p.add_argument("--identity", help="leader-election identity (default: $POD_NAME or hostname, plus a random suffix)")
    p.add_argument("--host", default="0.0.0.0", help="address of /healthz, /readyz, /leader")
    p.add_argument("--port", type=int, default=8091)
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_autoscaler)

    m = subparsers.add_parser("metrics-api", help="serve custom.metrics.k8s.io (queue depth) to the HPA",
                              description="An aggregated API server for custom.metrics.k8s.io v1beta1/v1beta2.")
    m.add_argument("--config", help="YAML (prometheus, metrics, allowed_client_names, authorization); default: "
                                     "queue_depth from vllm:num_requests_waiting on http://127.0.0.1:9090, "
                                     "SubjectAccessReview of every user")
    m.add_argument("--kubeconfig")
    m.add_argument("--host", default="0.0.0.0")
    m.add_argument("--port", type=int, default=6443)
    m.add_argument("--tls-cert", required=True)
    m.add_argument("--tls-key", required=True)
    m.add_argument("--client-ca", required=True, help="the front-proxy CA (requestheader-client-ca-file)")
    m.set_defaults(func=cmd_metrics_api)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _api_message(exc) -> str:
    try:
        return json.loads(exc.body)["message"]
    except (TypeError, ValueError, KeyError):
        return str(exc.body)


def cmd_autoscaler(args: argparse.Namespace) -> int:
    from kubernetes.client.exceptions import ApiException

    from .config import ConfigError, load_autoscaler_config
    from .service import AutoscalerService

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = load_autoscaler_config(args.config)
        if args.dry_run:
            config = config.model_copy(update={"dry_run": True})
        service = AutoscalerService(config, args.kubeconfig, identity=args.identity)
    except ConfigError as exc:
        print(f"gpuaas autoscaler: refusing to start:\n{exc}", file=sys.stderr)
        return 2
    if args.once:
        elector = service.elector
        if elector is not None:
            try:
                acquired = elector.acquire_once()
            except ApiException as exc:
                print(f"gpuaas autoscaler: cannot take lease {elector.namespace}/{elector.name}: {exc.status} "
                      f"{exc.reason}: {_api_message(exc)}", file=sys.stderr)
                return 1
            if not acquired:
                holder = elector.observed.holder if elector.observed else None
                print(f"gpuaas autoscaler: lease {elector.namespace}/{elector.name} is held by {holder}: another "
                      "replica is scaling these targets; not syncing", file=sys.stderr)
                return 1
        try:
            for key, d in service.controller.sync_once().items():
                print(f"{key}: {d.desired} ({d.reason}) {d.message}")
        finally:
            if elector is not None:
                elector.release()
        return 0
    service.run(_stop_on_signals(), host=args.host, port=args.port)
    return 0


def cmd_metrics_api(args: argparse.Namespace) -> int:
    from runtime.authz import Authorizer, KubeAccessReviewer
    from runtime.kubeclient import api_client

    from .config import ConfigError, load_metrics_api_config
    from .metrics_api import Backend, KubePods, MetricsApiServer, init_app, server_ssl_context
    from .prom import Prometheus

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = load_metrics_api_config(args.config)
        ctx = server_ssl_context(args.tls_cert, args.tls_key, args.client_ca)
    except ConfigError as exc:
        print(f"gpuaas metrics-api: refusing to start:\n{exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"gpuaas metrics-api: TLS files: {exc}", file=sys.stderr)
        return 2
    prom = Prometheus(config.prometheus.url, timeout_s=config.prometheus.timeout_s)
    api = api_client(args.kubeconfig)
    try:
        backend = Backend(config, prom, KubePods(api))
        backend.validate()
    except ConfigError as exc:
        print(f"gpuaas metrics-api: refusing to start:\n{exc}", file=sys.stderr)
        return 2
    authz = config.authorization
    authorizer = Authorizer(KubeAccessReviewer(api, timeout_s=authz.timeout_s), allow_ttl_s=authz.allow_ttl_s,
                            deny_ttl_s=authz.deny_ttl_s, size=authz.cache_size,
                            always_allow_groups=tuple(authz.always_allow_groups)) if authz.enabled else None
    MetricsApiServer(init_app(backend, config.allowed_client_names, authorizer), host=args.host, port=args.port,
                     ssl_context=ctx).run()
    return 0
