"""Where the control-plane binaries are. `scripts/setup.sh` builds them into the cache and writes `$GPUAAS_CACHE/env`;
environment variables of the same names override it (for a machine that has them elsewhere)."""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path


class ToolsMissing(RuntimeError):
    """A binary the control plane needs is not installed."""


def cache_dir() -> Path:
    return Path(os.environ.get("GPUAAS_CACHE") or Path.home() / ".cache" / "gpuaas")


@dataclass(frozen=True)
class Tools:
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    kwok: Path
    kwok_stages: Path
    etcd: Path
    prometheus: Path | None
    helm: Path | None  # for the chart in deploy/helm only; the control plane runs without it
    # Karpenter's KWOK controller (scripts/build-karpenter.sh), its CRDs in `crds/` beside it: for clusters that start
    # Karpenter (gpuaas/cluster/karpenter.py); the control plane runs without it.
    karpenter: Path | None = None
    # Cluster API's core manager (scripts/build-capi.sh), its CRDs in `crds/` beside it: for clusters that start
    # Cluster API (gpuaas/cluster/clusterapi.py).
    capi: Path | None = None

    @classmethod
    def locate(cls) -> Tools:
        env = _read_env_file(cache_dir() / "env")
        env.update({k: v for k, v in os.environ.items() if k.startswith("GPUAAS_")})
        missing = [k for k in ("GPUAAS_KUBE_BIN", "GPUAAS_KWOK_BIN", "GPUAAS_ETCD_BIN") if not env.get(k)]
        if missing:
            raise ToolsMissing(
                f"{', '.join(missing)} not set and {cache_dir() / 'env'} has none: run scripts/setup.sh first"
            )
        kube = Path(env["GPUAAS_KUBE_BIN"])
        kwok = Path(env["GPUAAS_KWOK_BIN"])
        prom = env.get("GPUAAS_PROMETHEUS_BIN") or shutil.which("prometheus")
        helm = env.get("GPUAAS_HELM_BIN") or shutil.which("helm")
        karpenter = env.get("GPUAAS_KARPENTER_BIN")
        capi = env.get("GPUAAS_CAPI_BIN")
        tools = cls(
            kube_apiserver=kube / "kube-apiserver",
            kube_controller_manager=kube / "kube-controller-manager",
            kube_scheduler=kube / "kube-scheduler",
            kubectl=kube / "kubectl",
            kwok=kwok,
            kwok_stages=kwok.parent / "stage",
            etcd=Path(env["GPUAAS_ETCD_BIN"]),
            prometheus=Path(prom) if prom else None,
            helm=Path(helm) if helm else None,
            karpenter=Path(karpenter) if karpenter else None,
            capi=Path(capi) if capi else None,
        )
        for name in ("kube_apiserver", "kube_controller_manager", "kube_scheduler", "kubectl", "kwok", "etcd"):
            path = getattr(tools, name)
            if not os.access(path, os.X_OK):
                raise ToolsMissing(f"{name.replace('_', '-')} not found at {path}: run scripts/setup.sh")
        return tools


def _read_env_file(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.startswith("#"):
            out[key.strip()] = value.strip()
    return out
