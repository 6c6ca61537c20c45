"""The gangs admission webhook called by the real kube-apiserver: `gpuaas gangs` serving it over HTTPS under the
ServiceAccount deploy/bases/gangs ships, registered with the selectors and failurePolicy deploy/ ships
(gpuaas/cluster/webhooks.py points them at 127.0.0.1 with the local CA). Group members come out of creation gated,
other pods never reach it, a malformed group is refused with its reason, and a burst of 500 creations all pass."""
from __future__ import annotations

import contextlib
import json
import statistics
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client.parser import text_string_to_metric_families

from gpuaas.cluster.components import gangs_process
from gpuaas.cluster.process import free_port
from gpuaas.cluster.webhooks import gangs_webhook_registered, gangs_webhook_settings
from scoring.gangs import (
    GANG_GATE,
    GANG_LABEL,
    GANG_SIZE_ANNOTATION,
    KUEUE_GATE,
    KUEUE_GROUP_LABEL,
    KUEUE_TOTAL_ANNOTATION,
)
from tests.deploy.manifests import DEPLOY, NAMESPACE

GANGS = DEPLOY / "bases" / "gangs"
NO_SCHEDULER = "gpuaas-test-nobody"  # pods in no group stay Pending: the burst measures admission, not scheduling


@pytest.fixture(scope="module")
def webhook(cluster, tmp_path_factory):
    """`gpuaas gangs` with its shipped config and RBAC, the webhook on a free port, registered inside the module."""
    cp = cluster.control_plane
    workdir = tmp_path_factory.mktemp("gang-webhook")
    kubeconfig = cluster.service_account_kubeconfig(GANGS, "gpuaas-gangs")
    port = free_port()
    config = {**yaml.safe_load((GANGS / "gangs-config.yaml").read_text()),
              "webhook": gangs_webhook_settings(cp.pki, port)}
    (workdir / "gangs.yaml").write_text(yaml.safe_dump(config))
    proc = gangs_process(workdir, kubeconfig, workdir / "gangs.yaml").start(timeout=60)
    try:
        with gangs_webhook_registered(cluster.api, cp.pki, port):
            yield proc
    finally:
        proc.stop()
        with contextlib.suppress(ApiException):
            client.CoordinationV1Api(cluster.api).delete_namespaced_lease("gpuaas-gangs", NAMESPACE)
    # RBAC's refusals name the user ("... is forbidden: User ..."); a namespace being deleted refuses events too.
    refused = [line for line in proc.log.read_text(errors="replace").splitlines() if "is forbidden: User" in line]
    assert not refused, "\n".join(refused[:10])


def pod(name: str, labels: dict | None = None, annotations: dict | None = None, *, gates=(),
        scheduler: str | None = None) -> dict:
    spec: dict = {"containers": [{"name": "c", "image": "busybox"}]}
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec,
            "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}}}


def gate_names(p: client.V1Pod) -> list[str]:
    return [g.name for g in p.spec.scheduling_gates or ()]


def reviews(proc) -> dict[str, float]:
    """The webhook's reviews by outcome, and its latency histogram's buckets, from the process's /metrics."""
    with urllib.request.urlopen(f"{proc.url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "gpuaas_gangs_webhook_reviews_total":
                out[s.labels["outcome"]] = s.value
            elif s.name == "gpuaas_gangs_webhook_duration_seconds_bucket":
                out[f"le={s.labels['le']}"] = s.value
    return out


def test_a_group_member_is_created_gated_and_keeps_another_components_gate(cluster, namespace, webhook):
    core = client.CoreV1Api(cluster.api)
    created = core.create_namespaced_pod(namespace, pod("m-0", {GANG_LABEL: "train"}, {GANG_SIZE_ANNOTATION: "3"}))
    assert gate_names(created) == [GANG_GATE]
    assert gate_names(core.read_namespaced_pod("m-0", namespace)) == [GANG_GATE]
    kueue = core.create_namespaced_pod(namespace, pod("k-0", {KUEUE_GROUP_LABEL: "q"}, {KUEUE_TOTAL_ANNOTATION: "2"},
                                                      gates=[KUEUE_GATE]))
    assert gate_names(kueue) == [KUEUE_GATE, GANG_GATE]
    already = core.create_namespaced_pod(namespace, pod("m-1", {GANG_LABEL: "train"}, {GANG_SIZE_ANNOTATION: "3"},
                                                        gates=[GANG_GATE]))
    assert gate_names(already) == [GANG_GATE]


def test_a_pod_in_no_group_is_untouched_and_never_reaches_the_webhook(cluster, namespace, webhook):
    before = reviews(webhook)
    created = client.CoreV1Api(cluster.api).create_namespaced_pod(
        namespace, pod("plain", {"app": "llm"}, {GANG_SIZE_ANNOTATION: "3"}, scheduler=NO_SCHEDULER))
    assert gate_names(created) == []
    after = reviews(webhook)
    assert sum(v for k, v in after.items() if not k.startswith("le=")) == \
        sum(v for k, v in before.items() if not k.startswith("le="))  # the objectSelector kept it away


def test_a_malformed_group_member_is_refused_with_the_label_to_fix(cluster, namespace, webhook):
    core = client.CoreV1Api(cluster.api)
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod(namespace, pod("bad", {GANG_LABEL: "train"}))
    assert refused.value.status == 400
    message = json.loads(refused.value.body)["message"]
    assert message.startswith('admission webhook "gpuaas.gangs.gpuaas.io" denied the request: gpuaas gangs: a pod '
                              "labelled gpuaas.io/gang=train needs annotation gpuaas.io/gang-size"), message
    # What a user sees at kubectl apply.
    manifest = {**pod("bad", {GANG_LABEL: "train"}, {GANG_SIZE_ANNOTATION: "four"}),
                "metadata": {"name": "bad", "namespace": namespace, "labels": {GANG_LABEL: "train"},
                             "annotations": {GANG_SIZE_ANNOTATION: "four"}}}
    result = cluster.control_plane.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest), check=False)
    assert result.returncode != 0
    assert "annotation gpuaas.io/gang-size must be a whole number, not 'four'" in result.stderr, result.stderr
    with pytest.raises(ApiException):
        core.read_namespaced_pod("bad", namespace)


def test_kube_system_is_out_of_the_webhooks_reach(cluster, webhook):
    core = client.CoreV1Api(cluster.api)
    created = core.create_namespaced_pod("kube-system", pod("gangs-webhook-excluded", {GANG_LABEL: "x"},
                                                            scheduler=NO_SCHEDULER), dry_run="All")
    assert gate_names(created) == []  # neither refused (no size) nor gated: never reviewed


def test_a_burst_of_500_creations_half_of_them_group_members_all_pass_in_time(cluster, namespace, webhook):
    core = client.CoreV1Api(cluster.api)
    n = 500
    # Members of 25 gangs of 20 that announce 100 members each: they stay gated, waiting for the rest.
    bodies = [pod(f"member-{i:03d}", {GANG_LABEL: f"burst-{i % 25}"}, {GANG_SIZE_ANNOTATION: "100"})
              if i % 2 == 0 else pod(f"plain-{i:03d}", {"app": "burst"}, scheduler=NO_SCHEDULER) for i in range(n)]
    before = reviews(webhook)

    def create(body: dict) -> tuple[float, list[str] | str]:
        started = time.perf_counter()
        try:
            created = core.create_namespaced_pod(namespace, body)
        except ApiException as err:
            return time.perf_counter() - started, f"{err.status}: {err.body}"
        return time.perf_counter() - started, gate_names(created)

    started = time.perf_counter()
    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(create, bodies))
    wall = time.perf_counter() - started
    failed = [(b["metadata"]["name"], r) for b, (_, r) in zip(bodies, results, strict=True) if isinstance(r, str)]
    assert not failed, failed[:5]
    for body, (_, gates) in zip(bodies, results, strict=True):
        member = GANG_LABEL in body["metadata"]["labels"]
        assert gates == ([GANG_GATE] if member else []), body["metadata"]["name"]
    after = reviews(webhook)
    assert after["gated"] - before.get("gated", 0) == n // 2
    assert after.get("error", 0) == before.get("error", 0) == 0
    latencies = sorted(t for t, _ in results)
    # Pods in no group skip the webhook: their creations are the baseline the members' are compared with.
    by_kind = {kind: statistics.median(t for body, (t, _) in zip(bodies, results, strict=True)
                                       if (GANG_LABEL in body["metadata"]["labels"]) == member)
               for kind, member in (("members", True), ("others", False))}
    # The server's own time per review: the smallest histogram bucket holding 99 % and all of the burst's reviews.
    buckets = sorted((float(k[3:]), after[k] - before.get(k, 0)) for k in after if k.startswith("le="))
    reviewed = buckets[-1][1]
    p99 = next(le for le, count in buckets if count >= 0.99 * reviewed)
    slowest = next(le for le, count in buckets if count >= reviewed)
    print(f"\n{n} pods ({n // 2} group members) created by 32 threads in {wall:.2f} s ({n / wall:.0f}/s); "
          f"creation latency p50 {statistics.median(latencies) * 1000:.1f} ms, "
          f"p99 {latencies[int(0.99 * n) - 1] * 1000:.1f} ms, max {latencies[-1] * 1000:.1f} ms (median: members "
          f"{by_kind['members'] * 1000:.1f} ms, others {by_kind['others'] * 1000:.1f} ms); "
          f"webhook: {reviewed:.0f} reviews, 99 % within {p99 * 1000:g} ms, all within {slowest * 1000:g} ms")
    assert latencies[-1] < 5.0  # no creation came near the webhook's 5 s timeout
