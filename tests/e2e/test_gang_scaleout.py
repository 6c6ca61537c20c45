"""A gang and the node scaler on a real control plane: the node scaler grows exactly the nodes the whole gang needs,
the gang controller places it on them whole once they are up."""
from __future__ import annotations

import time

import pytest
import yaml
from kubernetes import client

from gpuaas.cluster.components import nodescaler_process
from gpuaas.cluster.local import LocalCluster
from gpuaas.cluster.migmanager import FakeNodeAgent
from runtime.pools import parse_pool_spec
from scoring.kubeobjects import POOL_LABEL

from .kube import wait_for
from .test_gangs import bound, gang_controller, job, members

A100X8 = {"gpu": {"model": "A100-80GB", "count": 8}, "cpu": "128", "memory": "1Ti"}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("gang-scaleout")
    cluster = LocalCluster(workdir, name="gangscale")
    procs = []
    agent = None
    try:
        cluster.up(parse_pool_spec({"pools": [{"name": "a100", "count": 1, **A100X8}]}))
        agent = FakeNodeAgent(cluster.api).start()  # registers the GPUs of new nodes, as the device plugin would
        ns_cfg = workdir / "nodescaler.yaml"
        ns_cfg.write_text(yaml.safe_dump({
            "interval_s": 1, "scale_out": {"new_pod_delay_s": 2},
            "groups": [{"name": "a100x8", "template": A100X8, "min_size": 0, "max_size": 8,
                        "provisioning_delay_s": 1, "cost_per_hour": 20}],
            "scale_in": {"unneeded_s": 600, "delay_after_add_s": 600},
            "leader_election": {"enabled": False}}))
        procs.append(nodescaler_process(workdir, cluster.kubeconfig, ns_cfg).start(timeout=60))
        with gang_controller(cluster, workdir):
            yield cluster
    finally:
        for p in procs:
            p.stop()
        if agent:
            agent.stop()
        cluster.down()


def test_the_node_scaler_grows_exactly_enough_for_the_whole_gang(env):
    cluster = env
    core = client.CoreV1Api(cluster.api)
    core.create_namespace({"metadata": {"name": "train"}})
    client.BatchV1Api(cluster.api).create_namespaced_job("train", job("big", 4, 8))  # 32 GPUs, 8 free
    started = time.monotonic()
    wait_for(lambda: len(bound(members(cluster.api, "train", "big"))) == 4, timeout=120,
             what="all four members bound on grown nodes")
    grown = core.list_node(label_selector=f"{POOL_LABEL}=a100x8").items
    assert len(grown) == 3, [n.metadata.name for n in grown]  # 4 x 8 GPUs: the free node plus three new ones
    pods = members(cluster.api, "train", "big")
    assert len({p.spec.node_name for p in pods}) == 4
    print(f"\ngang of 4 x 8 GPUs: 3 nodes grown, all bound {time.monotonic() - started:.1f} s after the Job")
