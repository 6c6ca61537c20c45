"""What deploy/ ships is accepted by the real apiserver and the real kube-scheduler."""
from __future__ import annotations

import subprocess

import pytest
import yaml

from tests.deploy.manifests import DEPLOY, kustomize_dirs


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
    # its extender CA at a file that exists here (kube-scheduler reads it at start).
    local_config = {**shipped, "clientConnection": {"kubeconfig": str(cluster.kubeconfig)}}
    local_config["extenders"][0]["tlsConfig"]["caFile"] = str(cluster.control_plane.pki.ca_cert)
    local = tmp_path / "config.yaml"
    local.write_text(yaml.safe_dump(local_config))
    out = tmp_path / "effective.yaml"
    result = subprocess.run([str(cluster.control_plane.tools.kube_scheduler), f"--config={local}",
                             f"--write-config-to={out}"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    effective = yaml.safe_load(out.read_text())
    assert effective["extenders"][0]["bindVerb"] == "bind"
    assert [p["schedulerName"] for p in effective["profiles"]][-1] == "gpuaas-scheduler"
