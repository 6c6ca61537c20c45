"""What the node scaler's end-to-end tests (KWOK, Karpenter, Cluster API providers) look at and build."""
from __future__ import annotations

from kubernetes import client

from scoring.kubeobjects import POOL_LABEL


def running(api, namespace, selector=None) -> int:
    """Pods Running and not being deleted."""
    return sum(1 for p in client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector).items
               if p.status.phase == "Running" and p.metadata.deletion_timestamp is None)


def group_nodes(api, group: str) -> list:
    return client.CoreV1Api(api).list_node(label_selector=f"{POOL_LABEL}={group}").items


def pdb(namespace: str, app: str, min_available: int) -> dict:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": app, "namespace": namespace},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}}}


def only_groups(pod_spec: dict, *groups: str) -> dict:
    """Keep a pod to the nodes of these node groups (required node affinity on the pool label)."""
    pod_spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": list(groups)}]}]}}}
    return pod_spec
