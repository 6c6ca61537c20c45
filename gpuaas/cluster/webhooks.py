"""The gangs admission webhook on a local cluster: kube-apiserver calls `https://127.0.0.1:<port>/mutate-pods`, whose
serving certificate the cluster CA signs (its caBundle), with the same webhooks, selectors and failurePolicy as the
MutatingWebhookConfiguration deploy/bases/gangs ships (gangs.webhook.mutating_webhook_configuration makes both).

    cert, key = gangs_webhook_certificate(pki)                       # once per cluster
    config = {"webhook": gangs_webhook_settings(pki, port), ...}     # the `webhook:` section of `gpuaas gangs`' config
    gangs_process(workdir, kubeconfig, config_path).start()          # or WebhookServer(...).start(), in process
    with gangs_webhook_registered(cluster.api, pki, port): ...       # the apiserver calls it inside the block

failurePolicy is Fail: while registered, a group member cannot be created unless the webhook answers. Unregister (the
context manager does) before stopping the server.
"""
from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gangs.webhook import CONFIGURATION_NAME, PATH, mutating_webhook_configuration
from scoring.gangs import GANG_GATE, GANG_LABEL, GANG_SIZE_ANNOTATION

from .pki import Pki, issue_serving_cert

GANGS_WEBHOOK_SERVING = ("gangs-webhook", "gpuaas-gangs-webhook")  # (file stem, CN), for 127.0.0.1 and localhost


def gangs_webhook_certificate(pki: Pki) -> tuple[Path, Path]:
    """(cert, key) of the webhook's serving certificate, signed by the cluster CA; issued on first use."""
    stem, common_name = GANGS_WEBHOOK_SERVING
    cert, key = pki.path(f"{stem}.crt"), pki.path(f"{stem}.key")
    if cert.exists() and key.exists():
        return cert, key
    return issue_serving_cert(pki, stem, common_name)


def gangs_webhook_settings(pki: Pki, port: int) -> dict[str, Any]:
    """The `webhook:` section of a gangs config (gangs.config.WebhookConfig) serving on `port` with the local
    certificate."""
    cert, key = gangs_webhook_certificate(pki)
    return {"port": port, "cert_file": str(cert), "key_file": str(key)}


def local_webhook_configuration(pki: Pki, port: int, host: str = "127.0.0.1") -> dict[str, Any]:
    """The shipped MutatingWebhookConfiguration, pointed at a URL on this machine instead of the Service."""
    ca = base64.b64encode(pki.ca_cert.read_bytes()).decode()
    return mutating_webhook_configuration({"url": f"https://{host}:{port}{PATH}", "caBundle": ca})


def register_gangs_webhook(api: client.ApiClient, pki: Pki, port: int, *, timeout: float = 30.0) -> dict[str, Any]:
    """Register the webhook for a server on 127.0.0.1:`port` (replacing an earlier registration), and return once
    the apiserver gates group members with it."""
    body = local_webhook_configuration(pki, port)
    unregister_gangs_webhook(api)
    client.AdmissionregistrationV1Api(api).create_mutating_webhook_configuration(body)
    wait_until_gating(api, timeout=timeout)
    return body


def unregister_gangs_webhook(api: client.ApiClient) -> None:
    with suppress(ApiException):  # not registered
        client.AdmissionregistrationV1Api(api).delete_mutating_webhook_configuration(CONFIGURATION_NAME)


def wait_until_gating(api: client.ApiClient, *, namespace: str = "default", timeout: float = 30.0) -> None:
    """Poll with server-side dry runs of a group member's creation until the apiserver returns it gated: the
    apiserver picks a new registration up from its watch, a moment after it is created."""
    core = client.CoreV1Api(api)
    probe = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"gangs-webhook-probe-{uuid.uuid4().hex[:6]}",
                          "labels": {GANG_LABEL: "webhook-probe"}, "annotations": {GANG_SIZE_ANNOTATION: "1"}},
             "spec": {"containers": [{"name": "probe", "image": "probe"}]}}
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        try:
            created = core.create_namespaced_pod(namespace, probe, dry_run="All")
            names = [g.name for g in created.spec.scheduling_gates or ()]
            if GANG_GATE in names:
                return
            last = f"created with gates {names}"
        except ApiException as err:  # the webhook not answering yet: failurePolicy Fail refuses the member
            last = f"{err.status}: {err.body}"
        time.sleep(0.2)
    raise TimeoutError(f"the apiserver did not gate a group member within {timeout:.0f} s; last: {last}")


@contextmanager
def gangs_webhook_registered(api: client.ApiClient, pki: Pki, port: int, *,
                             timeout: float = 30.0) -> Iterator[dict[str, Any]]:
    """The webhook registered for 127.0.0.1:`port` inside the block, unregistered after it."""
    try:
        yield register_gangs_webhook(api, pki, port, timeout=timeout)
    finally:
        unregister_gangs_webhook(api)
