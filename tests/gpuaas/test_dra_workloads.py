"""The DRA pods the replay (bench/extender_replay.py --dra) and tests submit: what gpuaas reads back from the pod and
its template (scoring.draclaims.pod_dra) is the demand the pod was made for, as a user would write it
(docs/devices.md, "What a user writes in DRA mode")."""
from __future__ import annotations

import dataclasses

import pytest

from gpuaas.workloads import dra_claim_template, dra_pod_for_demand, dra_template_name
from scoring.draclaims import pod_dra
from scoring.gangs import GANG_GATE, gates
from scoring.model import PodDemand

DEMANDS = [
    PodDemand(cpu_milli=6000, memory_mib=12288, gpus=1, gpu_milli=1000, name="ml/whole"),
    PodDemand(cpu_milli=32000, memory_mib=65536, gpus=8, gpu_milli=1000, name="ml/eight"),
    PodDemand(cpu_milli=4000, memory_mib=8192, gpus=1, gpu_milli=460, name="ml/share"),
    PodDemand(cpu_milli=4000, memory_mib=8192, gpus=1, gpu_milli=1000, mig_profile="3g.40gb", name="ml/mig"),
    PodDemand(cpu_milli=4000, memory_mib=8192, gpus=2, gpu_milli=1000, allowed_models=frozenset({"A100-80GB"}),
              name="ml/model"),
]


@pytest.mark.parametrize("demand", DEMANDS, ids=lambda d: d.name)
def test_the_pod_and_its_template_read_back_as_the_demand(demand):
    name = demand.name.split("/")[1]
    pod = dra_pod_for_demand(name, "ml", demand, gated=True)
    template = dra_claim_template(demand, "ml")
    assert pod["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": dra_template_name(demand)}]
    assert "nvidia.com/gpu" not in pod["spec"]["containers"][0]["resources"]["requests"]
    assert tuple(gates(pod)) == (GANG_GATE,)
    read = pod_dra(pod, {}, {f"ml/{template['metadata']['name']}": template})
    assert read is not None and read.demand == dataclasses.replace(demand, claims=True)  # asked through a claim
    assert read.missing  # the claim itself is kube-controller-manager's to generate


def test_cpu_only_pods_ask_for_no_claim_and_shapes_share_templates():
    pod = dra_pod_for_demand("c", "ml", PodDemand(cpu_milli=1000, memory_mib=1024), gated=True)
    assert "resourceClaims" not in pod["spec"] and not gates(pod)
    assert dra_template_name(PodDemand(gpus=1, gpu_milli=250)) == "share-250"
    assert dra_template_name(PodDemand(gpus=4, gpu_milli=1000)) == "gpu-4"
    with pytest.raises(ValueError, match="selectors can name one"):
        dra_claim_template(PodDemand(gpus=1, gpu_milli=1000, allowed_models=frozenset({"A100-80GB", "T4"})), "ml")
