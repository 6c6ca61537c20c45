"""What deploy/ ships is accepted by the real apiserver and the real kube-scheduler."""
from __future__ import annotations

import contextlib
import subprocess

import pytest
import yaml
from kubernetes import client

from extender.schedconfig import IN_CLUSTER_URL
from gpuaas.cluster.components import extender_process, scheduler_extender_tls
from gpuaas.cluster.process import free_port, spawn, terminate
from gpuaas.workloads import gpu_pod
from scoring.kubeobjects import DEVICES_ANNOTATION
from tests.deploy.manifests import DEPLOY, NAMESPACE, kustomize_dirs

from .kube import pod, pod_phase, wait_for


@pytest.mark.parametrize("overlay", kustomize_dirs("overlays"), ids=lambda p: p.name)
def test_overlay_passes_a_server_side_dry_run(cluster, gpuaas_namespace, overlay):
    result = cluster.control_plane.kubectl("apply", "--dry-run=server", "-k", str(overlay), check=False)
    assert result.returncode == 0, result.stderr
    assert "(server dry run)" in result.stdout
    # gpuaas-system enforces the restricted Pod Security Standard: the apiserver warns of any pod template that
    # would be refused there.
    assert "would violate PodSecurity" not in result.stderr, result.stderr


@pytest.mark.parametrize("path", ["overlays/default-scheduler/scheduler-config.yaml",
                                  "bases/second-scheduler/scheduler-config.yaml"])
def test_kube_scheduler_accepts_the_shipped_configuration(cluster, tmp_path, path):
    shipped = yaml.safe_load((DEPLOY / path).read_text())
    # With --config, kube-scheduler takes its kubeconfig from the file only: point a copy at the test cluster, and
    # its extender CA and client certificate at files that exist here (kube-scheduler reads them at start).
    local_config = {**shipped, "clientConnection": {"kubeconfig": str(cluster.kubeconfig)}}
    paths = scheduler_extender_tls(cluster.control_plane.pki)
    assert len(local_config["extenders"]) == 2  # GPU pods; pods that ask for no GPU
    for entry in local_config["extenders"]:
        tls = entry["tlsConfig"]
        assert set(tls) == {"caFile", "certFile", "keyFile"}  # mTLS: kube-scheduler presents a client certificate
        tls.update(caFile=paths["ca_file"], certFile=paths["cert_file"], keyFile=paths["key_file"])
    local = tmp_path / "config.yaml"
    local.write_text(yaml.safe_dump(local_config))
    out = tmp_path / "effective.yaml"
    result = subprocess.run([str(cluster.control_plane.tools.kube_scheduler), f"--config={local}",
                             f"--write-config-to={out}"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    effective = yaml.safe_load(out.read_text())
    assert effective["extenders"][0]["bindVerb"] == "bind"
    assert effective["extenders"][1]["urlPrefix"].endswith("/cpu") and effective["extenders"][1]["ignorable"]
    assert [p["schedulerName"] for p in effective["profiles"]][-1] == "gpuaas-scheduler"


def test_second_scheduler_and_extender_schedule_a_gpu_pod_with_only_their_shipped_rbac(cluster, namespace, tmp_path):
    """deploy/overlays/second-scheduler, run as processes: the real extender over HTTPS under its ServiceAccount, and
    a second kube-scheduler with the shipped configuration under its own. A pod asking for gpuaas-scheduler is bound
    by the extender with its devices recorded, over mTLS (kube-scheduler's client certificate; the local cluster's
    CA stands for the one of gpuaas-extender-tls), the scheduler holds its Lease, and neither logged a refusal."""
    cp = cluster.control_plane
    extender_kc = cluster.service_account_kubeconfig(DEPLOY / "bases" / "extender", "gpuaas-extender")
    scheduler_kc = cluster.service_account_kubeconfig(DEPLOY / "bases" / "second-scheduler", "gpuaas-scheduler")
    port = free_port()
    extender = extender_process(tmp_path, extender_kc, port=port, pki=cp.pki)
    config = yaml.safe_load((DEPLOY / "bases" / "second-scheduler" / "scheduler-config.yaml").read_text())
    config["clientConnection"] = {"kubeconfig": str(scheduler_kc)}
    local = scheduler_extender_tls(cp.pki)
    for entry in config["extenders"]:  # the Service's name, on loopback; the GPU pods' entry and /cpu
        entry["urlPrefix"] = entry["urlPrefix"].replace(IN_CLUSTER_URL,
                                                        f"https://127.0.0.1:{port}")
        entry["tlsConfig"].update(caFile=local["ca_file"], certFile=local["cert_file"], keyFile=local["key_file"])
    (tmp_path / "scheduler.yaml").write_text(yaml.safe_dump(config))
    log = tmp_path / "logs" / "gpuaas-scheduler.log"
    coord = client.CoordinationV1Api(cluster.api)
    scheduler = None
    try:
        extender.start()
        scheduler = spawn([str(cp.tools.kube_scheduler), f"--config={tmp_path / 'scheduler.yaml'}",
                           f"--authentication-kubeconfig={scheduler_kc}", f"--authorization-kubeconfig={scheduler_kc}",
                           "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--v=2"], log)
        body = gpu_pod("via-gpuaas-scheduler", namespace, gpus=2)
        body["spec"]["schedulerName"] = "gpuaas-scheduler"
        client.CoreV1Api(cluster.api).create_namespaced_pod(namespace, body)
        wait_for(lambda: pod_phase(cluster.api, namespace, "via-gpuaas-scheduler") == "Running", timeout=60,
                 what="the pod Running")
        devices = pod(cluster.api, namespace, "via-gpuaas-scheduler").metadata.annotations[DEVICES_ANNOTATION]
        assert len(set(devices.split(","))) == 2  # bound by the extender
        lease = coord.read_namespaced_lease("gpuaas-scheduler", NAMESPACE)
        assert lease.spec.holder_identity
        refused = [line for line in log.read_text(errors="replace").splitlines() if "forbidden" in line.lower()]
        refused += [line for line in extender.log.read_text(errors="replace").splitlines() if " 403" in line
                    or "forbidden" in line.lower()]
        assert not refused, "\n".join(refused[:10])
    finally:
        if scheduler is not None:
            terminate(scheduler.pid, str(cp.tools.kube_scheduler), popen=scheduler)
        extender.stop()
        with contextlib.suppress(client.ApiException):
            coord.delete_namespaced_lease("gpuaas-scheduler", NAMESPACE)
