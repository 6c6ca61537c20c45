"""What the Helm chart renders is accepted by the real apiserver:
`helm template | kubectl apply --dry-run=server -f -`."""
from __future__ import annotations

import pytest

from tests.deploy.chart import template_text
from tests.deploy.manifests import NAMESPACE
from tests.deploy.test_helm_chart import TOGGLES


def dry_run(cluster, manifests: str) -> None:
    result = cluster.control_plane.kubectl("apply", "--dry-run=server", "-f", "-", input=manifests, check=False)
    assert result.returncode == 0, result.stderr
    assert "(server dry run)" in result.stdout
    # The release namespace enforces the restricted Pod Security Standard: the apiserver warns of any pod template
    # that would be refused there.
    assert "would violate PodSecurity" not in result.stderr, result.stderr


@pytest.mark.parametrize("values", [{}, *TOGGLES.values()], ids=["defaults", *TOGGLES])
def test_the_chart_passes_a_server_side_dry_run(cluster, gpuaas_namespace, values):
    manifests = template_text(values)
    assert manifests.count("\nkind: ") >= 3
    dry_run(cluster, manifests)


def test_a_release_in_another_namespace_passes_a_server_side_dry_run(cluster, namespace):
    cluster.control_plane.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    manifests = template_text({"prometheusScrapeConfigs": {"namespace": namespace},
                               "grafanaDashboard": {"namespace": namespace}}, namespace=namespace)
    assert NAMESPACE not in manifests
    dry_run(cluster, manifests)
