"""The one place that turns a kubeconfig (or the in-cluster service account) into a way to talk to the apiserver:
a kubernetes-client ApiClient for request/response work, and an aiohttp session for long watches."""
from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from kubernetes import client, config


def configuration(kubeconfig: Path | str | None = None) -> client.Configuration:
    """Client configuration from `kubeconfig`; None means in-cluster, falling back to ~/.kube/config."""
    conf = client.Configuration()
    if kubeconfig is None:
        try:
            config.load_incluster_config(client_configuration=conf)
        except config.ConfigException:
            config.load_kube_config(client_configuration=conf)
    else:
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=conf)
    return conf


def api_client(kubeconfig: Path | str | None = None, *, pool_size: int = 32) -> client.ApiClient:
    """An ApiClient for `kubeconfig`. `pool_size` bounds concurrent connections, so that thread pools issuing many
    requests are not serialised on urllib3's default pool."""
    conf = configuration(kubeconfig)
    conf.connection_pool_maxsize = pool_size
    return client.ApiClient(conf)


@dataclass(frozen=True)
class ApiEndpoint:
    """Where the apiserver is and how to authenticate, for aiohttp."""

    server: str
    ssl_context: ssl.SSLContext | bool
    headers: dict[str, str]

    @classmethod
    def from_configuration(cls, conf: client.Configuration) -> ApiEndpoint:
        if conf.verify_ssl:
            ctx: ssl.SSLContext | bool = ssl.create_default_context(cafile=conf.ssl_ca_cert)
        else:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if conf.cert_file and isinstance(ctx, ssl.SSLContext):
            ctx.load_cert_chain(conf.cert_file, conf.key_file)
        headers = {}
        token = conf.api_key.get("authorization") or conf.api_key.get("BearerToken")
        if token:
            headers["Authorization"] = token if token.lower().startswith("bearer ") else f"Bearer {token}"
        return cls(server=conf.host.rstrip("/"), ssl_context=ctx, headers=headers)

    @classmethod
    def from_kubeconfig(cls, kubeconfig: Path | str | None = None) -> ApiEndpoint:
        return cls.from_configuration(configuration(kubeconfig))

    def session(self, **kwargs) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            base_url=self.server, headers=self.headers,
            connector=aiohttp.TCPConnector(ssl=self.ssl_context, limit=32), **kwargs)
