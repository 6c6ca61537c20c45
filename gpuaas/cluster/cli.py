"""`gpuaas cluster up|status|down`: a local KWOK GPU cluster that outlives the command, for demos and debugging."""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from kubernetes import client

from runtime.kubeclient import api_client
from runtime.pools import POOL_LABEL, PoolSpecError

from .controlplane import ControlPlane, ControlPlaneError
from .local import LocalCluster, builtin_pool_specs, resolve_pool_spec
from .process import process_alive
from .tools import ToolsMissing, cache_dir


def cluster_dir(name: str) -> Path:
    return cache_dir() / "clusters" / name


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("cluster", help="run a local KWOK GPU cluster (real control plane, fake nodes)")
    verbs = parser.add_subparsers(dest="cluster_verb", metavar="up|status|down", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--name", default="gpuaas", help="cluster name (default: %(default)s)")
    common.add_argument("--dir", type=Path, help="work directory (default: $GPUAAS_CACHE/clusters/NAME)")

    up = verbs.add_parser("up", parents=[common], help="start the control plane and create the GPU node pools")
    up.add_argument("--pools", default="demo",
                    help=f"pool spec: a YAML file or a built-in name ({', '.join(builtin_pool_specs())}); "
                         "default: %(default)s")
    up.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for readiness")
    up.add_argument("--provisioner", choices=("none", "karpenter", "clusterapi"), default="none",
                    help="also start a node provisioner: `karpenter` runs Karpenter's KWOK controller (its CRDs, a "
                         "KWOKNodeClass `default`, instance types from the node groups) for the node scaler's "
                         "karpenter provider; `clusterapi` runs Cluster API's core manager and the test-only KWOK "
                         "infrastructure provider, with a Cluster `gpuaas` and a MachineDeployment (0 replicas) per "
                         "node group in namespace `default` for the clusterapi provider (docs/node-autoscaling.md); "
                         "default: %(default)s")
    up.add_argument("--nodescaler-config", type=Path,
                    help="with --provisioner karpenter or clusterapi: the node scaler config whose karpenter groups "
                         "give Karpenter's instance types, or whose clusterapi groups get MachineDeployments "
                         "(default: the pool spec's autoscale pools, each an instance type or a MachineDeployment "
                         "named after the pool)")
    up.set_defaults(func=cmd_up)
    status = verbs.add_parser("status", parents=[common], help="show components and nodes")
    status.set_defaults(func=cmd_status)
    down = verbs.add_parser("down", parents=[common], help="stop every process of the cluster")
    down.set_defaults(func=cmd_down)


def _workdir(args: argparse.Namespace) -> Path:
    return args.dir or cluster_dir(args.name)


def cmd_up(args: argparse.Namespace) -> int:
    try:
        spec = resolve_pool_spec(args.pools)  # refuse a broken spec before any process starts
    except PoolSpecError as err:
        print(f"gpuaas cluster up: {err}", file=sys.stderr)
        return 2
    cluster = LocalCluster(_workdir(args), name=args.name, owned=False)
    try:
        groups = _provisioner_groups(args, spec) if args.provisioner != "none" else []
    except (ValueError, OSError) as err:
        print(f"gpuaas cluster up: {err}", file=sys.stderr)
        return 2
    try:
        timings = cluster.up(spec, timeout=args.timeout)
        if args.provisioner == "karpenter":
            from .karpenter import start_karpenter

            start_karpenter(cluster.control_plane, groups, api=cluster.api, timeout=args.timeout)
        if args.provisioner == "clusterapi":
            from .clusterapi import start_capi_with_groups

            start_capi_with_groups(cluster.control_plane, cluster.api, groups, timeout=args.timeout)
    except (ToolsMissing, ControlPlaneError, TimeoutError) as err:
        print(f"gpuaas cluster up: {err}", file=sys.stderr)
        cluster.down()
        return 1
    except BaseException:
        cluster.down()  # never leave a half-started cluster behind
        raise
    gpus = sum(p.count * (p.gpu.count if p.gpu else 0) for p in spec.pools)
    print(f"cluster {args.name} is up: {spec.node_count} nodes, {gpus} GPUs, ready in {timings['total_s']:.1f}s "
          f"(control plane {timings['control_plane_s']:.1f}s, nodes {timings.get('nodes_ready_s', 0):.1f}s)")
    for pool in spec.pools:
        gpu = f"{pool.gpu.count} x {pool.gpu.model}" + (f" MIG {pool.gpu.mig_config_label()}" if pool.gpu.mig else "") \
            if pool.gpu else "no GPU"
        print(f"  pool {pool.name:<12} {pool.count:>5} nodes  {gpu}")
    if args.provisioner == "karpenter":
        types = sorted({g.karpenter.instance_type for g in groups if g.karpenter})
        print(f"  karpenter: KWOKNodeClass default, instance types {', '.join(types) or 'none'}")
    if args.provisioner == "clusterapi":
        mds = [f"{g.clusterapi.namespace}/{g.clusterapi.machine_deployment}" for g in groups if g.clusterapi]
        print(f"  clusterapi: Cluster default/gpuaas, MachineDeployments {', '.join(mds) or 'none'}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    print(f"logs: {cluster.control_plane.logs}")
    return 0


def _provisioner_groups(args: argparse.Namespace, spec) -> list:
    """The node groups the provisioner serves: the karpenter (clusterapi) groups of --nodescaler-config, or the pool
    spec's autoscale pools (instance type, MachineDeployment: the pool's name)."""
    from nodescaler.config import NodeGroupConfig, load_nodescaler_config

    section = args.provisioner
    if args.nodescaler_config is not None:
        return [g for g in load_nodescaler_config(args.nodescaler_config, environ={}).groups
                if getattr(g, section) is not None]
    extra = {"karpenter": {"instance_type": "{}"}, "clusterapi": {"machine_deployment": "{}"}}[section]
    return [NodeGroupConfig.model_validate({**NodeGroupConfig.from_pool(p).model_dump(), "provider": section,
                                            section: {k: v.format(p.name) for k, v in extra.items()}})
            for p in spec.pools if p.autoscale]


def cmd_status(args: argparse.Namespace) -> int:
    cp = ControlPlane(_workdir(args), name=args.name)
    if not cp.attach_existing():
        print(f"cluster {args.name}: not running")
        return 1
    for name, st in cp.status().items():
        print(f"  {name:<24} {'running' if st['running'] else 'STOPPED':<8} pid {st['pid']}  port {st['port']}")
    try:
        api = api_client(cp.kubeconfig)
        nodes = client.CoreV1Api(api).list_node(label_selector=POOL_LABEL).items
        ready = sum(any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or ()) for n in nodes)
        phases = Counter(p.status.phase for p in client.CoreV1Api(api).list_pod_for_all_namespaces().items)
        print(f"  nodes: {ready}/{len(nodes)} Ready; pods: {dict(phases) or 'none'}")
        print(f"export KUBECONFIG={cp.kubeconfig}")
    except Exception as err:  # the status of a half-dead cluster is still worth printing
        print(f"  apiserver not answering: {err}")
        return 1
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    cp = ControlPlane(_workdir(args), name=args.name)
    running = cp.attach_existing()
    processes = [(c.pid, c.argv[0]) for c in cp.state.components.values()] if cp.state else []
    cp.stop()
    survivors = [pid for pid, argv0 in processes if process_alive(pid, argv0)]
    if survivors:
        print(f"gpuaas cluster down: processes {survivors} survived SIGKILL", file=sys.stderr)
        return 1
    print(f"cluster {args.name}: {'stopped' if running else 'was not running'}; logs kept in {cp.logs}")
    return 0


def add_fake_node_agent(nodescaler: argparse.ArgumentParser) -> None:
    """Give `gpuaas nodescaler` the harness's `--fake-node-agent`: the node agent (migmanager.py) runs beside the
    node scaler for as long as it runs. The node scaler itself (nodescaler/) knows nothing of it."""
    nodescaler.add_argument("--fake-node-agent", action="store_true",
                            help="local KWOK clusters only: also play the device plugin and the GPU operator's MIG "
                                 "manager (gpuaas/cluster/migmanager.py), so that new nodes get their GPUs and MIG "
                                 "configs apply")
    run = nodescaler.get_default("func")

    def cmd_nodescaler_with_agent(args: argparse.Namespace) -> int:
        if not args.fake_node_agent:
            return run(args)
        from .migmanager import FakeNodeAgent

        agent = FakeNodeAgent(api_client(args.kubeconfig)).start()
        try:
            return run(args)
        finally:
            agent.stop()

    nodescaler.set_defaults(func=cmd_nodescaler_with_agent)
