"""The harness against a real kube-apiserver, kube-controller-manager and kube-scheduler, with kwok GPU nodes."""
from __future__ import annotations

from kubernetes import client

from gpuaas.workloads import gpu_deployment, gpu_pod

from .kube import pod, pod_events, pod_phase, wait_for


def test_nodes_publish_what_gfd_and_the_device_plugin_publish(cluster):
    nodes = {n.metadata.name: n for n in client.CoreV1Api(cluster.api).list_node().items}
    a100, mig = nodes["a100-0000"], nodes["a100-mig-0000"]
    assert a100.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert a100.metadata.labels["nvidia.com/gpu.count"] == "8"
    assert a100.status.allocatable["nvidia.com/gpu"] == "8"
    # all-3g.40gb on 8 MIG GPUs: two 3g.40gb instances each, no whole GPU left in mixed strategy.
    assert mig.metadata.labels["nvidia.com/mig.config"] == "all-3g.40gb"
    assert mig.status.allocatable["nvidia.com/mig-3g.40gb"] == "16"
    assert mig.status.allocatable["nvidia.com/gpu"] == "0"
    assert all(any(c.type == "Ready" and c.status == "True" for c in n.status.conditions) for n in nodes.values())


def test_two_gpu_pod_is_scheduled_onto_a_gpu_node(cluster, namespace):
    client.CoreV1Api(cluster.api).create_namespaced_pod(namespace, gpu_pod("train", namespace, gpus=2))
    wait_for(lambda: pod_phase(cluster.api, namespace, "train") == "Running", what="pod train Running")
    node = pod(cluster.api, namespace, "train").spec.node_name
    assert node.startswith(("a100-", "h100-")) and not node.startswith("a100-mig")


def test_mig_pod_lands_only_where_the_profile_is_advertised(cluster, namespace):
    core = client.CoreV1Api(cluster.api)
    for i in range(4):
        core.create_namespaced_pod(namespace, gpu_pod(f"mig-{i}", namespace, mig="3g.40gb"))
    # 1g.10gb is advertised nowhere in this cluster.
    core.create_namespaced_pod(namespace, gpu_pod("mig-absent", namespace, mig="1g.10gb"))
    for i in range(4):
        wait_for(lambda i=i: pod_phase(cluster.api, namespace, f"mig-{i}") == "Running", what=f"mig-{i} Running")
        assert pod(cluster.api, namespace, f"mig-{i}").spec.node_name.startswith("a100-mig-")
    reason = wait_for(lambda: [e.message for e in pod_events(cluster.api, namespace, "mig-absent")
                               if e.reason == "FailedScheduling"], what="FailedScheduling for mig-absent")
    assert "Insufficient nvidia.com/mig-1g.10gb" in reason[0]
    assert pod_phase(cluster.api, namespace, "mig-absent") == "Pending"


def test_pod_larger_than_any_node_stays_pending_with_the_schedulers_reason(cluster, namespace):
    client.CoreV1Api(cluster.api).create_namespaced_pod(namespace, gpu_pod("huge", namespace, gpus=16))
    messages = wait_for(lambda: [e.message for e in pod_events(cluster.api, namespace, "huge")
                                 if e.reason == "FailedScheduling"], what="a FailedScheduling event")
    assert "Insufficient nvidia.com/gpu" in messages[0]
    assert "0/7 nodes are available" in messages[0]
    assert pod_phase(cluster.api, namespace, "huge") == "Pending"
    assert pod(cluster.api, namespace, "huge").spec.node_name is None


def test_deployment_scaled_to_five_gets_five_running_pods(cluster, namespace):
    apps, core = client.AppsV1Api(cluster.api), client.CoreV1Api(cluster.api)
    apps.create_namespaced_deployment(namespace, gpu_deployment("serve", namespace, replicas=1, gpus=1))
    wait_for(lambda: (apps.read_namespaced_deployment("serve", namespace).status.ready_replicas or 0) == 1,
             what="1 ready replica")
    apps.patch_namespaced_deployment_scale("serve", namespace, {"spec": {"replicas": 5}})

    def running() -> int:
        pods = core.list_namespaced_pod(namespace, label_selector="app=serve").items
        return sum(p.status.phase == "Running" and p.spec.node_name is not None for p in pods)

    wait_for(lambda: running() == 5, timeout=90, what="5 Running pods")
    # The Deployment's status follows its pods' in the controller-manager's own time: wait for it, do not race it.
    wait_for(lambda: apps.read_namespaced_deployment("serve", namespace).status.ready_replicas == 5, timeout=90,
             what="5 ready replicas in the Deployment's status")


def test_pod_annotated_to_complete_after_five_seconds_succeeds(cluster, namespace):
    client.CoreV1Api(cluster.api).create_namespaced_pod(namespace, gpu_pod("job", namespace, gpus=1,
                                                                           complete_after="5s"))
    wait_for(lambda: pod_phase(cluster.api, namespace, "job") == "Succeeded", timeout=90, what="job Succeeded")
    done = pod(cluster.api, namespace, "job").status
    terminated = done.container_statuses[0].state.terminated
    assert terminated.reason == "Completed" and terminated.exit_code == 0
    # kwok's own timestamps, not the test's polling: the 5 s run from when the pod turned Ready (its condition's
    # lastTransitionTime, second resolution), so at least 4 s separate it from finishedAt however loaded the machine.
    # How long completion takes past the 5 s is a benchmark's number (bench/kwok_completion.py), not a test's bound.
    ready = next(c for c in done.conditions if c.type == "Ready")
    assert (terminated.finished_at - ready.last_transition_time).total_seconds() >= 4, (ready, terminated)


def test_pod_without_the_annotation_keeps_running(cluster, namespace):
    core = client.CoreV1Api(cluster.api)
    core.create_namespaced_pod(namespace, gpu_pod("server", namespace, gpus=1))
    wait_for(lambda: pod_phase(cluster.api, namespace, "server") == "Running", what="server Running")
    # A witness started after the server completes after 7 s, longer than the 1 s delay and 5 s jitter of kwok's
    # stock pod-complete stage: once kwok has completed the witness it has had every chance to complete the server.
    core.create_namespaced_pod(namespace, gpu_pod("witness", namespace, gpus=1, complete_after="7s"))
    wait_for(lambda: pod_phase(cluster.api, namespace, "witness") == "Succeeded", timeout=90, what="witness Succeeded")
    assert pod_phase(cluster.api, namespace, "server") == "Running"
