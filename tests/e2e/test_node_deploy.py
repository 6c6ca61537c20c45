"""deploy/nodescaler is accepted by the real apiserver, and its config by the nodescaler's own loader."""
from __future__ import annotations

from pathlib import Path


from autoscaler.nodes.config import load_nodescaler_config

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "nodescaler"


def test_nodescaler_overlay_passes_a_server_side_dry_run(cluster, gpuaas_namespace):
    result = cluster.control_plane.kubectl("apply", "--dry-run=server", "-k", str(DEPLOY), check=False)
    assert result.returncode == 0, result.stderr
    assert "deployment.apps/gpuaas-nodescaler created (server dry run)" in result.stdout


def test_shipped_config_loads_and_its_lease_is_the_one_rbac_allows():
    config = load_nodescaler_config(DEPLOY / "nodescaler-config.yaml", environ={})
    assert config.leader_election.name == "gpuaas-nodescaler"
    assert "resourceNames: [gpuaas-nodescaler]" in (DEPLOY / "rbac.yaml").read_text()
