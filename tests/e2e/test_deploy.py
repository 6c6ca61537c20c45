"""What deploy/ ships is accepted by the real apiserver and the real kube-scheduler."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from extender.schedconfig import kube_scheduler_configuration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


@pytest.mark.parametrize("overlay", ["extender", "second-scheduler"])
def test_overlay_passes_a_server_side_dry_run(cluster, gpuaas_namespace, overlay):
    result = cluster.control_plane.kubectl("apply", "--dry-run=server", "-k", str(DEPLOY / overlay), check=False)
    assert result.returncode == 0, result.stderr
    assert "(server dry run)" in result.stdout


@pytest.mark.parametrize("path,second", [("extender/scheduler-config.yaml", False),
                                         ("second-scheduler/scheduler-config.yaml", True)])
def test_scheduler_configuration_is_what_the_code_generates_and_kube_scheduler_accepts(cluster, tmp_path, path,
                                                                                         second):
    shipped = yaml.safe_load((DEPLOY / path).read_text())
    assert shipped == kube_scheduler_configuration(second_scheduler=second)
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
