"""Informers on the DRA objects a component's model reads (docs/devices.md, "DRA mode"), where the cluster serves
resource.k8s.io/v1 (Kubernetes 1.34 on): ResourceSlices and ResourceClaims, which a scoring.clusterview.ClusterView
reads into its DRA nodes and the devices claims hold (scoring.draview), and, for a component that reads what pods
waiting for their claims ask, ResourceClaimTemplates (a template's spec stands for a claim not generated yet:
scoring.draclaims.pod_dra). The extender, the gang controller and the node scaler set theirs up here. RBAC: `list,
watch` on each."""
from __future__ import annotations

import logging

import aiohttp

from scoring.dra import DRA_API
from scoring.draview import CLAIM_KIND, SLICE_KIND

from .informer import Informer, OnChange
from .kubeclient import ApiEndpoint

log = logging.getLogger("gpuaas.runtime.dra")
TEMPLATE_KIND = "ResourceClaimTemplate"


async def dra_informers(session: aiohttp.ClientSession, endpoint: ApiEndpoint, on_change: OnChange | None,
                        resync_seconds: float = 300.0, *, templates: bool = False) -> dict[str, Informer]:
    """Kind -> informer of ResourceSlices and ResourceClaims (and ResourceClaimTemplates with `templates`), each
    calling `on_change(kind, old, new)`; none where the cluster does not serve resource.k8s.io/v1."""
    async with session.get(DRA_API) as resp:
        if resp.status == 404:
            log.info("resource.k8s.io/v1 not served: no DRA nodes in the model")
            return {}
        resp.raise_for_status()
    kinds = [("resourceslices", SLICE_KIND), ("resourceclaims", CLAIM_KIND)]
    if templates:
        kinds.append(("resourceclaimtemplates", TEMPLATE_KIND))
    return {kind: Informer(endpoint, f"{DRA_API}/{plural}", kind=kind, on_change=on_change,
                           resync_seconds=resync_seconds) for plural, kind in kinds}
