"""The extender behind the real kube-scheduler, over mTLS: filter, prioritize and bind on a KWOK GPU cluster, and
what a caller without kube-scheduler's certificate gets."""
from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request

import pytest
from kubernetes import client

from extender.schedconfig import extender_entries, gpuaas_profile
from gpuaas.cluster.components import extender_process, scheduler_extender_tls
from gpuaas.cluster.local import LocalCluster
from gpuaas.cluster.process import free_port
from gpuaas.workloads import gpu_pod
from runtime.pools import parse_pool_spec
from scoring.kubeobjects import DEVICES_ANNOTATION
from tests.deploy.manifests import DEPLOY

from .kube import pod, pod_events, pod_phase, wait_for

POOLS = {"pools": [
    {"name": "a100", "count": 4, "gpu": {"model": "A100-80GB", "count": 8}, "cpu": "128", "memory": "1Ti"},
    {"name": "h100", "count": 2, "gpu": {"model": "H100-80GB", "count": 8}, "cpu": "128", "memory": "1Ti"},
    {"name": "mig", "count": 2, "gpu": {"model": "A100-80GB", "count": 8, "mig": "all-balanced"}, "cpu": "128",
     "memory": "1Ti"},
]}


@pytest.fixture(scope="module")
def gpu_cluster(tmp_path_factory):
    """kube-scheduler calls the extender over HTTPS with its own client certificate (CN system:kube-scheduler, from
    the cluster CA), as deploy/ wires it, through both entries deploy/ ships (GPU pods; pods that ask for no GPU);
    the extender verifies it against the cluster CA."""
    workdir = tmp_path_factory.mktemp("extender-cluster")
    port = free_port()
    cluster = LocalCluster(workdir, name="ext", scheduler_profiles=[gpuaas_profile("default-scheduler")])
    pki = cluster.control_plane.pki  # its paths are known before the cluster writes it
    cluster.control_plane.extenders = extender_entries(f"https://127.0.0.1:{port}", **scheduler_extender_tls(pki))
    extender = None
    try:
        cluster.up(parse_pool_spec(POOLS))
        # The extender runs with exactly the permissions deploy/bases/extender grants it.
        sa_kubeconfig = cluster.service_account_kubeconfig(DEPLOY / "bases" / "extender", "gpuaas-extender")
        extender = extender_process(workdir, sa_kubeconfig, port=port, pki=pki)
        extender.start()
        yield cluster, extender
    finally:
        if extender is not None:
            extender.stop()
        cluster.down()


@pytest.fixture
def ns(gpu_cluster):
    cluster, _ = gpu_cluster
    name = f"x-{time.monotonic_ns() % 10**8}"
    core = client.CoreV1Api(cluster.api)
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)
    # Wait for the namespace's pods to go, so that the next test starts from free GPUs.
    wait_for(lambda: not core.list_namespaced_pod(name).items, timeout=60, what=f"pods of {name} deleted")


def devices_by_node(pods) -> dict[str, list[int]]:
    """The GPU indices gpuaas recorded, per node: a GPU listed twice on one node was double-booked."""
    per_node: dict[str, list[int]] = {}
    for p in pods:
        per_node.setdefault(p.spec.node_name, []).extend(
            int(d) for d in p.metadata.annotations[DEVICES_ANNOTATION].split(","))
    return per_node


def running_on(api, namespace):
    return {p.metadata.name: p for p in client.CoreV1Api(api).list_namespaced_pod(namespace).items
            if p.status.phase == "Running"}


def scheduled_false(api, namespace, name) -> str | None:
    """The scheduler's verdict that it could not place the pod (PodScheduled=False): its reason, else None."""
    for cond in pod(api, namespace, name).status.conditions or ():
        if cond.type == "PodScheduled" and cond.status == "False":
            return cond.reason or "False"
    return None


def test_gpu_pods_are_bound_by_the_extender_with_their_devices_recorded(gpu_cluster, ns):
    cluster, _ = gpu_cluster
    core = client.CoreV1Api(cluster.api)
    for i, gpus in enumerate((8, 4, 2, 1, 1)):
        core.create_namespaced_pod(ns, gpu_pod(f"p{i}", ns, gpus=gpus))
    pods = wait_for(lambda: (r := running_on(cluster.api, ns)) and len(r) == 5 and r, what="5 Running pods")
    held: dict[str, set[int]] = {}
    for p in pods.values():
        devices = [int(d) for d in p.metadata.annotations[DEVICES_ANNOTATION].split(",")]
        assert len(devices) == int(p.spec.containers[0].resources.limits["nvidia.com/gpu"])
        assert not held.setdefault(p.spec.node_name, set()) & set(devices), "a GPU was given twice"
        held[p.spec.node_name] |= set(devices)
    # Fragmentation-aware packing: the 4, 2, 1 and 1-GPU pods (8 GPUs) fill one 8-GPU node instead of spreading:
    # after the 4-GPU pod, its node's 4 free GPUs fit the 2-GPU pod with the least stranded capacity, and so on.
    assert len({p.spec.node_name for name, p in pods.items() if name != "p0"}) == 1


def test_a_cpu_only_pod_is_ranked_by_gpuaas_and_strands_no_whole_gpu(gpu_cluster, ns):
    """A pod that asks for 100 of a node's 128 cores, beside a 4-GPU pod: wherever it lands on an A100 or H100 node,
    the GPUs left there have too little CPU to serve. gpuaas (the CPU-pod entry's prioritize) ranks the MIG nodes
    first, whose GPUs are partitioned and hold no idle whole GPU; kube-scheduler alone would pick any of the eight
    nodes (this profile has no resource scoring), a MIG node one time in four."""
    cluster, _extender = gpu_cluster
    core = client.CoreV1Api(cluster.api)
    core.create_namespaced_pod(ns, gpu_pod("gpu4", ns, gpus=4))
    wait_for(lambda: running_on(cluster.api, ns).get("gpu4"), what="the 4-GPU pod Running")
    core.create_namespaced_pod(ns, gpu_pod("cpu100", ns, cpu="100"))
    placed = wait_for(lambda: pod(cluster.api, ns, "cpu100").spec.node_name, what="the CPU-only pod bound")
    assert placed.startswith("mig-"), f"the CPU-only pod went to {placed}, stranding GPUs there"
    assert DEVICES_ANNOTATION not in (pod(cluster.api, ns, "cpu100").metadata.annotations or {})


def test_mig_pods_get_distinct_mig_slots_chosen_by_the_extender(gpu_cluster, ns):
    cluster, _ = gpu_cluster
    core = client.CoreV1Api(cluster.api)
    # all-balanced on A100-80GB: per GPU 2 x 1g.10gb, 1 x 2g.20gb, 1 x 3g.40gb; 2 nodes x 8 GPUs. kube-scheduler sees
    # only a node's count of 3g.40gb instances (8); which GPU's instance a pod gets is the extender's choice, recorded
    # in gpuaas.io/devices, and two pods on one GPU's single 3g.40gb instance would be a double booking.
    for i in range(6):
        core.create_namespaced_pod(ns, gpu_pod(f"m3g-{i}", ns, mig="3g.40gb"))
    core.create_namespaced_pod(ns, gpu_pod("m7g", ns, mig="7g.80gb"))  # no such instance in any layout
    pods = wait_for(lambda: (r := running_on(cluster.api, ns)) and len(r) == 6 and r, what="6 MIG pods Running")
    assert {p.spec.node_name.split("-")[0] for p in pods.values()} == {"mig"}
    per_node = devices_by_node(pods.values())  # KeyError if the extender did not bind one of them
    for node, gpus in per_node.items():
        assert len(gpus) == len(set(gpus)), f"one GPU's 3g.40gb instance given twice on {node}: {sorted(gpus)}"
    assert sum(len(g) for g in per_node.values()) == 6
    # The scheduler's verdict on the 7g pod, not a read of Pending right after creating it.
    assert wait_for(lambda: scheduled_false(cluster.api, ns, "m7g"), what="m7g judged unschedulable") == \
        "Unschedulable"
    assert pod(cluster.api, ns, "m7g").spec.node_name is None


def test_pod_that_accepts_no_present_gpu_model_stays_pending_with_our_reason(gpu_cluster, ns):
    cluster, _ = gpu_cluster
    p = gpu_pod("wants-h200", ns, gpus=1)
    p["metadata"]["annotations"] = {"gpuaas.io/gpu-models": "H200-141GB"}
    client.CoreV1Api(cluster.api).create_namespaced_pod(ns, p)
    messages = wait_for(lambda: [e.message for e in pod_events(cluster.api, ns, "wants-h200")
                                 if e.reason == "FailedScheduling"], what="FailedScheduling event")
    assert "GPU model A100-80GB is not one the pod accepts (H200-141GB)" in messages[-1]
    assert pod_phase(cluster.api, ns, "wants-h200") == "Pending"


def test_deleting_pods_frees_their_gpus_for_the_next_ones(gpu_cluster, ns):
    cluster, _ = gpu_cluster
    core = client.CoreV1Api(cluster.api)
    # Whole-GPU capacity: 4 A100 + 2 H100 nodes x 8 GPUs = 6 eight-GPU pods; the seventh waits.
    for i in range(7):
        core.create_namespaced_pod(ns, gpu_pod(f"full-{i}", ns, gpus=8))
    wait_for(lambda: len(running_on(cluster.api, ns)) == 6, what="6 eight-GPU pods Running")
    waiting = [n for n in (f"full-{i}" for i in range(7)) if pod_phase(cluster.api, ns, n) == "Pending"]
    assert len(waiting) == 1
    victim = next(iter(running_on(cluster.api, ns)))
    core.delete_namespaced_pod(victim, ns)
    wait_for(lambda: pod_phase(cluster.api, ns, waiting[0]) == "Running", timeout=60,
             what="the waiting pod Running once GPUs were freed")


def pinned(name, namespace, node, gpus):
    p = gpu_pod(name, namespace, gpus=gpus)
    p["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return p


def test_restarted_extender_rebuilds_device_state_from_the_pods(gpu_cluster, ns):
    """Old and new pods must share one node: a restarted extender that forgot the old pods' GPUs would give the new
    pod some of them."""
    cluster, extender = gpu_cluster
    core = client.CoreV1Api(cluster.api)
    node = "h100-0001"
    for i in range(2):
        core.create_namespaced_pod(ns, pinned(f"before-{i}", ns, node, 3))
    wait_for(lambda: len(running_on(cluster.api, ns)) == 2, what="2 pods Running")
    extender.kill()
    extender.start()
    core.create_namespaced_pod(ns, pinned("after", ns, node, 2))  # 6 of 8 GPUs are taken: exactly 2 are left
    pods = wait_for(lambda: (r := running_on(cluster.api, ns)) and len(r) == 3 and r, what="3 pods Running")
    assert {p.spec.node_name for p in pods.values()} == {node}
    devices = devices_by_node(pods.values())[node]
    assert sorted(devices) == sorted(set(devices)) and len(devices) == 8, f"GPU double-booked: {sorted(devices)}"


def test_nothing_is_bound_while_the_extender_is_down_and_everything_after(gpu_cluster, ns):
    cluster, extender = gpu_cluster
    core = client.CoreV1Api(cluster.api)
    sizes = [1, 2, 1, 4, 2, 1, 1, 2] * 3  # 24 pods, 42 of the 48 whole GPUs (the MIG pool has none)
    for i, gpus in enumerate(sizes[:12]):
        core.create_namespaced_pod(ns, gpu_pod(f"burst-{i:02d}", ns, gpus=gpus))
    wait_for(lambda: len(running_on(cluster.api, ns)) >= 3, interval=0.02, what="the burst under way")
    extender.kill()  # mid-burst: filter, prioritize and bind calls in flight are cut
    later = [f"burst-{i:02d}" for i in range(12, len(sizes))]
    for name, gpus in zip(later, sizes[12:], strict=True):  # the burst goes on while gpuaas is down
        core.create_namespaced_pod(ns, gpu_pod(name, ns, gpus=gpus))
    core.create_namespaced_pod(ns, gpu_pod("cpu-only", ns, cpu="2"))
    # ignorable: false. Every pod created while gpuaas is down is tried by the scheduler and fails; none is bound.
    wait_for(lambda: all(scheduled_false(cluster.api, ns, n) for n in later), timeout=60,
             what="the scheduler's verdict on every pod created while the extender is down")
    bound = [n for n in later if pod(cluster.api, ns, n).spec.node_name]
    assert bound == [], f"placed blind while the extender was down: {bound}"
    # The CPU-pod entry is ignorable: a pod that asks for no GPU is placed without gpuaas's ranking meanwhile.
    wait_for(lambda: pod(cluster.api, ns, "cpu-only").spec.node_name, timeout=60,
             what="the CPU-only pod bound while the extender is down")
    extender.start()
    pods = wait_for(lambda: (r := running_on(cluster.api, ns)) and len(r) == len(sizes) + 1 and r, timeout=120,
                    what=f"all {len(sizes)} GPU pods Running after the restart")
    pods.pop("cpu-only")
    per_node = devices_by_node(pods.values())
    for node, devices in per_node.items():
        assert len(devices) == len(set(devices)), f"GPU double-booked on {node}: {sorted(devices)}"
        assert max(devices) < 8
    assert sum(len(v) for v in per_node.values()) == sum(sizes)


# ---- who may call the extender -------------------------------------------------------------------------------------

def call(extender, path, body=None, *, cert=None, token=None, pki=None):
    """One request to the running extender; (status, parsed JSON body)."""
    ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
    if cert:
        ctx.load_cert_chain(pki.path(f"{cert}.crt"), pki.path(f"{cert}.key"))
    req = urllib.request.Request(f"{extender.url}{path}", data=json.dumps(body).encode() if body else None,
                                 headers={"Content-Type": "application/json",
                                          **({"Authorization": f"Bearer {token}"} if token else {})})
    def parsed(resp):
        body = resp.read()
        return json.loads(body) if resp.headers.get_content_type() == "application/json" else body.decode()

    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return resp.status, parsed(resp)
    except urllib.error.HTTPError as err:
        return err.code, parsed(err)


def test_without_the_schedulers_certificate_every_verb_and_explain_is_refused(gpu_cluster, ns):
    cluster, extender = gpu_cluster
    pki = cluster.control_plane.pki
    core = client.CoreV1Api(cluster.api)
    spec = gpu_pod("victim", ns, gpus=1)
    spec["spec"]["schedulerName"] = "nobody"  # no scheduler runs this profile: pending for good
    victim = core.create_namespaced_pod(ns, spec)
    nodes = [n.metadata.name for n in core.list_node().items]
    filter_args = {"Pod": client.ApiClient().sanitize_for_serialization(victim), "NodeNames": nodes}
    bind_args = {"PodName": "victim", "PodNamespace": ns, "PodUID": victim.metadata.uid, "Node": nodes[0]}
    requests = {"/filter": filter_args, "/prioritize": filter_args, "/bind": bind_args,
                f"/explain?pod={ns}/victim&node={nodes[0]}": None}
    # A ServiceAccount token with no permissions: authenticated by the apiserver (TokenReview), allowed nothing.
    core.create_namespaced_service_account(ns, {"metadata": {"name": "stranger"}})
    token = core.create_namespaced_service_account_token("stranger", ns, {"spec": {}}).status.token
    for path, body in requests.items():
        status, reply = call(extender, path, body, pki=pki)  # no credential
        assert status == 401, (path, status, reply)
        status, reply = call(extender, path, body, cert="admin", pki=pki)  # the cluster CA, not the scheduler
        assert status == 403 if path.startswith(("/filter", "/prioritize", "/bind")) else status == 200, \
            (path, status, reply)  # system:masters may read /explain, as it may read every pod
        status, reply = call(extender, path, body, token=token, pki=pki)
        assert status in (401, 403), (path, status, reply)
        assert victim.metadata.uid not in json.dumps(reply)
    status, _ = call(extender, f"/explain?pod={ns}/victim&node={nodes[0]}", token=token, pki=pki)
    assert status == 403  # reviewed: the token authenticated, and may not get pods in this namespace
    assert call(extender, "/readyz", pki=pki)[0] == 200  # probes need no credential
    assert pod(cluster.api, ns, "victim").spec.node_name is None


def test_a_pod_of_another_scheduler_is_never_bound_even_by_the_schedulers_certificate(gpu_cluster, ns):
    cluster, extender = gpu_cluster
    pki = cluster.control_plane.pki
    core = client.CoreV1Api(cluster.api)
    spec = gpu_pod("other", ns, gpus=1)
    spec["spec"]["schedulerName"] = "another-scheduler"
    other = core.create_namespaced_pod(ns, spec)
    # Called as kube-scheduler itself: gpuaas still refuses what the scheduler's profile and filters would refuse.
    status, reply = call(extender, "/bind", {"PodName": "other", "PodNamespace": ns, "PodUID": other.metadata.uid,
                                             "Node": "a100-0001"}, cert="scheduler", pki=pki)
    assert status == 200 and "another-scheduler is not one this extender serves" in reply["Error"], reply
    # A pod of this scheduler whose nodeSelector no node matches: the scheduler finds no node; bound by hand, refused.
    nowhere = core.create_namespaced_pod(ns, pinned("nowhere", ns, "no-such-node", 1))
    wait_for(lambda: scheduled_false(cluster.api, ns, "nowhere"), what="nowhere judged unschedulable")
    status, reply = call(extender, "/bind", {"PodName": "nowhere", "PodNamespace": ns,
                                             "PodUID": nowhere.metadata.uid, "Node": "a100-0001"},
                         cert="scheduler", pki=pki)
    assert status == 200 and "didn't match Pod's node affinity/selector" in reply["Error"], reply
    for name in ("other", "nowhere"):
        assert pod(cluster.api, ns, name).spec.node_name is None


def decisions(extender, pki) -> dict[tuple[str, str], float]:
    """The extender's gpuaas_extender_decisions_total counters, read as kube-scheduler's certificate reads them."""
    status, text = call(extender, "/metrics", cert="scheduler", pki=pki)
    assert status == 200, text
    out = {}
    for line in text.splitlines():
        if line.startswith("gpuaas_extender_decisions_total{"):
            labels, value = line[len("gpuaas_extender_decisions_total{"):].split("} ")
            pairs = dict(kv.split("=", 1) for kv in labels.split(","))
            out[(pairs["verb"].strip('"'), pairs["outcome"].strip('"'))] = float(value)
    return out


def test_a_plain_gpu_pod_is_decided_at_filter_and_a_pod_with_a_preference_is_ranked_with_kube_schedulers_scores(
        gpu_cluster, ns):
    cluster, extender = gpu_cluster
    pki = cluster.control_plane.pki
    core = client.CoreV1Api(cluster.api)
    before = decisions(extender, pki)
    core.create_namespaced_pod(ns, gpu_pod("plain", ns, gpus=2))
    wait_for(lambda: pod(cluster.api, ns, "plain").spec.node_name, what="plain bound")
    after = decisions(extender, pki)
    # filter left gpuaas's pick alone, so kube-scheduler called no prioritize: nothing was scored
    assert after.get(("filter", "decided"), 0) == before.get(("filter", "decided"), 0) + 1
    assert after.get(("prioritize", "scored"), 0) == before.get(("prioritize", "scored"), 0)
    prefers = gpu_pod("prefers", ns, gpus=1)
    prefers["spec"]["affinity"] = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchExpressions": [
            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["h100-0001"]}]}}]}}
    core.create_namespaced_pod(ns, prefers)
    wait_for(lambda: pod(cluster.api, ns, "prefers").spec.node_name, what="prefers bound")
    last = decisions(extender, pki)
    assert last.get(("filter", "decided"), 0) == after.get(("filter", "decided"), 0)
    assert last.get(("prioritize", "scored"), 0) > after.get(("prioritize", "scored"), 0)
    assert pod(cluster.api, ns, "plain").metadata.annotations[DEVICES_ANNOTATION].count(",") == 1
