"""One way to build a Kubernetes API client from a kubeconfig, for every shell of gpuaas that talks to a cluster."""
from __future__ import annotations

from pathlib import Path

from kubernetes import client, config


def api_client(kubeconfig: Path | str | None = None, *, pool_size: int = 32) -> client.ApiClient:
    """An ApiClient for `kubeconfig` (in-cluster config when None and running in a pod). `pool_size` bounds the
    concurrent connections, so that thread pools issuing many requests are not serialised on urllib3's default 1."""
    configuration = client.Configuration()
    if kubeconfig is None:
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            config.load_kube_config(client_configuration=configuration)
    else:
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)
