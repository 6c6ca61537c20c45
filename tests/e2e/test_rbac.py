"""What the ServiceAccounts of deploy/ may and may not do, shown with real API calls made with their tokens. Every call
that RBAC must refuse is also made as admin and succeeds, so the 403 comes from RBAC and not from a broken call."""
from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpuaas.workloads import gpu_pod
from runtime.kubeclient import api_client
from runtime.leader import LeaderElector
from tests.deploy.manifests import DEPLOY, NAMESPACE, render

ACCOUNTS = {"extender": "gpuaas-extender", "autoscaler": "gpuaas-autoscaler",
            "custom-metrics-api": "gpuaas-custom-metrics"}


@pytest.fixture(scope="module")
def as_account(cluster):
    """An ApiClient holding a token of the ServiceAccount of deploy/bases/<base>, with that base's RBAC applied."""
    made = {}

    def get(base: str) -> client.ApiClient:
        if base not in made:
            made[base] = api_client(cluster.service_account_kubeconfig(DEPLOY / "bases" / base, ACCOUNTS[base]))
        return made[base]

    yield get
    for api in made.values():
        api.close()


def status_of(call) -> int:
    try:
        call()
    except ApiException as err:
        return err.status
    return 200


def test_extender_cannot_delete_pods_nor_change_nodes(cluster, as_account, namespace):
    core = client.CoreV1Api(cluster.api)
    core.create_namespaced_pod(namespace, gpu_pod("victim", namespace, gpus=1))
    extender = client.CoreV1Api(as_account("extender"))
    assert extender.read_namespaced_pod("victim", namespace).metadata.name == "victim"  # its token works
    assert status_of(lambda: extender.delete_namespaced_pod("victim", namespace)) == 403
    assert status_of(lambda: extender.delete_collection_namespaced_pod(namespace)) == 403
    assert status_of(lambda: extender.patch_namespaced_pod("victim", namespace, {"metadata": {"labels": {"x": "y"}}})) \
        == 403
    assert core.read_namespaced_pod("victim", namespace).metadata.deletion_timestamp is None
    core.delete_namespaced_pod("victim", namespace, grace_period_seconds=0)  # admin may: the call itself is sound
    # Nor may it change nodes: it reads them only.
    node = core.list_node().items[0].metadata.name
    assert extender.read_node(node).metadata.name == node
    assert status_of(lambda: extender.patch_node(node, {"metadata": {"labels": {"gpuaas-test": "x"}}})) == 403
    core.patch_node(node, {"metadata": {"labels": {"gpuaas-test": None}}})


def test_extender_may_review_tokens_and_access_for_its_callers_and_nothing_more(cluster, as_account, namespace):
    """system:auth-delegator: the extender asks who a bearer token belongs to and what that user may do (/explain,
    /metrics), and that adds no power of its own."""
    extender = as_account("extender")
    review = client.AuthenticationV1Api(extender).create_token_review({"spec": {"token": "not-a-token"}})
    assert review.status.authenticated is not True  # the review was made, and said no
    sar = client.AuthorizationV1Api(extender).create_subject_access_review({"spec": {
        "user": "nobody", "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}})
    assert sar.status.allowed is False
    core = client.CoreV1Api(extender)
    assert status_of(lambda: core.list_namespaced_secret(namespace)) == 403
    assert status_of(lambda: core.create_namespaced_service_account_token("default", namespace, {"spec": {}})) == 403


@pytest.mark.parametrize("base", ["autoscaler", "custom-metrics-api"])
def test_autoscaler_and_metrics_api_cannot_read_secrets(cluster, as_account, namespace, base):
    core = client.CoreV1Api(cluster.api)
    core.create_namespaced_secret(namespace, {"metadata": {"name": "model-token"}, "stringData": {"token": "s3cret"}})
    sa = client.CoreV1Api(as_account(base))
    assert sa.list_namespaced_pod(namespace).items == []  # its token works
    assert status_of(lambda: sa.read_namespaced_secret("model-token", namespace)) == 403
    assert status_of(lambda: sa.list_namespaced_secret(namespace)) == 403
    assert status_of(lambda: sa.list_secret_for_all_namespaces()) == 403
    assert status_of(lambda: sa.list_namespaced_secret(NAMESPACE)) == 403  # not even in its own namespace
    assert core.read_namespaced_secret("model-token", namespace).data["token"]  # admin may


def test_metrics_api_may_delegate_authorization(cluster, as_account):
    """system:auth-delegator lets it ask the apiserver whether the user the aggregator forwards may read a metric."""
    review = client.AuthorizationV1Api(as_account("custom-metrics-api")).create_subject_access_review({
        "spec": {"user": "alice", "groups": ["team-a"],
                 "resourceAttributes": {"group": "custom.metrics.k8s.io", "resource": "pods", "verb": "get",
                                        "namespace": "default", "name": "*"}}})
    assert review.status.allowed is False  # answered (alice has no grant), rather than refused with 403


@pytest.mark.parametrize("user, groups, role", [
    # kube-controller-manager --use-service-account-credentials (kubeadm's setting, and the local cluster's)
    ("system:serviceaccount:kube-system:horizontal-pod-autoscaler",
     ["system:serviceaccounts", "system:serviceaccounts:kube-system"], "system:controller:horizontal-pod-autoscaler"),
    # without it, every controller runs as the controller-manager itself
    ("system:kube-controller-manager", [], "system:kube-controller-manager"),
])
def test_the_hpa_controller_reads_custom_metrics_by_its_bootstrap_role_not_by_ours(cluster, user, groups, role):
    review = client.AuthorizationV1Api(cluster.api).create_subject_access_review({
        "spec": {"user": user, "groups": [*groups, "system:authenticated"],
                 "resourceAttributes": {"group": "custom.metrics.k8s.io", "resource": "pods", "verb": "list",
                                        "namespace": "inference"}}})
    assert review.status.allowed, review.status
    assert f'ClusterRole "{role}"' in review.status.reason
    bindings = [d for d in render(DEPLOY / "overlays" / "all") if d["kind"] in ("RoleBinding", "ClusterRoleBinding")]
    assert not [d for d in bindings for s in d["subjects"] if s.get("namespace") == "kube-system"]


def test_autoscaler_may_hold_its_own_lease_and_no_other(cluster, as_account):
    coord = client.CoordinationV1Api(cluster.api)
    api = as_account("autoscaler")
    elector = LeaderElector(api, namespace=NAMESPACE, name="gpuaas-autoscaler", identity="rbac-test")
    try:
        assert elector.try_acquire_or_renew()  # create
        assert elector.try_acquire_or_renew()  # get, update
        assert coord.read_namespaced_lease("gpuaas-autoscaler", NAMESPACE).spec.holder_identity == "rbac-test"
    finally:
        coord.delete_namespaced_lease("gpuaas-autoscaler", NAMESPACE)
    coord.create_namespaced_lease(NAMESPACE, {"metadata": {"name": "someone-else"}, "spec": {"holderIdentity": "x"}})
    try:
        other = client.CoordinationV1Api(api)
        assert status_of(lambda: other.read_namespaced_lease("someone-else", NAMESPACE)) == 403
        assert status_of(lambda: other.patch_namespaced_lease("someone-else", NAMESPACE,
                                                              {"spec": {"holderIdentity": "me"}})) == 403
        assert status_of(lambda: other.delete_namespaced_lease("someone-else", NAMESPACE)) == 403
    finally:
        coord.delete_namespaced_lease("someone-else", NAMESPACE)
