"""The `extenders:` entries of a KubeSchedulerConfiguration that point kube-scheduler at gpuaas.

Pods that request a GPU resource go through filter, prioritize and bind (managedResources). kube-scheduler keeps
counting nvidia.com/gpu and nvidia.com/mig-* itself (the nodes advertise them); the GPU share resource exists on no
node, so the scheduler is told to ignore it and gpuaas alone accounts for it. Pods that ask for no GPU go through a
second, ignorable entry that ranks nodes (cpu_pods_entry), so that they do not strand GPUs, and holds them off the room
planned for a burst's GPU pods.
"""
from __future__ import annotations

from typing import Any

import yaml

from scoring.gpus import GPU_MODELS
from scoring.kubeobjects import GPU_RESOURCE, SHARE_RESOURCE


def managed_resources() -> list[dict[str, Any]]:
    mig = sorted({p.resource_name for m in GPU_MODELS.values() for p in m.mig_profiles.values()})
    return ([{"name": GPU_RESOURCE, "ignoredByScheduler": False}]
            + [{"name": r, "ignoredByScheduler": False} for r in mig]
            + [{"name": SHARE_RESOURCE, "ignoredByScheduler": True}])


# kube-scheduler adds `score x weight x 10` of the extender to its own plugins' scores. At 5, gpuaas's 0..10 is worth
# up to 500 points: more than the user-preference plugins together (NodeAffinity 2, TaintToleration 3,
# PodTopologySpread 2, InterPodAffinity 2, each 0..100), so packing decides among nodes the user treats alike.
DEFAULT_WEIGHT = 5


def gpuaas_profile(scheduler_name: str = "gpuaas", *, all_pods: bool = False) -> dict[str, Any]:
    """A scheduler profile for GPU pods: the in-tree resource scorers spread pods over the least-allocated nodes,
    which works against fragmentation-aware packing, so they are off; every filter stays on. Above 100 nodes
    kube-scheduler stops filtering once it has found a sample of feasible nodes (50% minus 1% per 125 nodes) and
    only that sample reaches the extender: packing needs to see every node, so the sample is 100%.
    `all_pods`: see extender_entry; the GPU share resource, which no node advertises, must then be ignored here."""
    profile: dict[str, Any] = {
        "schedulerName": scheduler_name, "percentageOfNodesToScore": 100,
        "plugins": {"score": {"disabled": [{"name": "NodeResourcesFit"}, {"name": "NodeResourcesBalancedAllocation"}]}},
    }
    if all_pods:
        profile["pluginConfig"] = [{"name": "NodeResourcesFit", "args": {"ignoredResources": [SHARE_RESOURCE]}}]
    return profile


def extender_entry(url_prefix: str, *, bind: bool = True, weight: int = DEFAULT_WEIGHT, timeout: str = "5s",
                   ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None,
                   ignorable: bool = False, all_pods: bool = False) -> dict[str, Any]:
    """The entry for GPU pods. `bind`: gpuaas binds GPU pods itself, recording the devices it chose (needed for GPU
    shares and for exact device accounting under bursts). `ignorable: False`: while gpuaas is down, GPU pods wait
    rather than being placed blind; other pods are unaffected.
    `all_pods`: send every pod through filter, prioritize and bind, not only GPU pods (measured against
    cpu_pods_entry in docs/extender.md); pair it with gpuaas_profile(all_pods=True).
    `cert_file`, `key_file`: the client certificate kube-scheduler presents (tlsConfig.certFile/keyFile); the
    extender serves its verbs to nobody else (its tls.client_ca_file and tls.client_names)."""
    entry: dict[str, Any] = {
        "urlPrefix": url_prefix,
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "weight": weight,
        "nodeCacheCapable": True,
        "httpTimeout": timeout,
        "ignorable": ignorable,
    }
    if not all_pods:
        entry["managedResources"] = managed_resources()
    if bind:
        entry["bindVerb"] = "bind"
    return _with_tls(entry, url_prefix, ca_file, cert_file, key_file)


CPU_PODS_PREFIX = "/cpu"  # where the extender answers cpu_pods_entry's prioritize


def cpu_pods_entry(url_prefix: str, *, weight: int = DEFAULT_WEIGHT, timeout: str = "5s",
                   ca_file: str | None = None, cert_file: str | None = None,
                   key_file: str | None = None) -> dict[str, Any]:
    """The entry for pods that ask for no GPU: filter and prioritize, no bind. Where such pods share nodes with GPU
    pods, kube-scheduler alone spreads them, and the CPU and memory they take strand the GPUs beside them (FGD's
    case); gpuaas ranks the nodes where that costs least. kube-scheduler's own filters decide where they fit; gpuaas's
    filter only holds them off the room planned for pending GPU pods while those are placed jointly (a burst), where
    they fit beside the plan elsewhere. The entry is ignorable: while gpuaas is down such pods are placed as without
    it. An extender entry cannot leave GPU pods out (managedResources only selects), so they reach it too and get
    every node back, and an empty ranking, at once (extender_entry filters and ranks them)."""
    entry: dict[str, Any] = {
        "urlPrefix": url_prefix.rstrip("/") + CPU_PODS_PREFIX,
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "weight": weight,
        "nodeCacheCapable": True,
        "httpTimeout": timeout,
        "ignorable": True,
    }
    return _with_tls(entry, url_prefix, ca_file, cert_file, key_file)


def extender_entries(url_prefix: str, *, cpu_pods: bool = True, **options: Any) -> list[dict[str, Any]]:
    """What a KubeSchedulerConfiguration's `extenders:` holds: the GPU pods' entry and, with `cpu_pods`, the entry
    that ranks nodes for pods that ask for no GPU. `options`: extender_entry's (TLS files, weight, timeout)."""
    entries = [extender_entry(url_prefix, **options)]
    if cpu_pods and not options.get("all_pods"):  # with all_pods the first entry sends them through every verb
        shared = {k: v for k, v in options.items() if k in ("weight", "timeout", "ca_file", "cert_file", "key_file")}
        entries.append(cpu_pods_entry(url_prefix, **shared))
    return entries


def _with_tls(entry: dict[str, Any], url_prefix: str, ca_file: str | None, cert_file: str | None,
              key_file: str | None) -> dict[str, Any]:
    if url_prefix.startswith("https://"):
        entry["enableHTTPS"] = True
        tls: dict[str, Any] = {"caFile": ca_file} if ca_file else {"insecure": True}
        if cert_file and key_file:
            tls.update(certFile=cert_file, keyFile=key_file)
        entry["tlsConfig"] = tls
    return entry


SECOND_SCHEDULER_NAME = "gpuaas-scheduler"
IN_CLUSTER_URL = "https://gpuaas-extender.gpuaas-system.svc:443"
# kube-scheduler's side of the mTLS: the secret gpuaas-scheduler-extender-client (tls.crt, tls.key: a client
# certificate with CN system:kube-scheduler; ca.crt: the CA that signed the extender's serving certificate and this
# one).
IN_CLUSTER_CLIENT_DIR = "/etc/gpuaas/extender-client"
IN_CLUSTER_CA = f"{IN_CLUSTER_CLIENT_DIR}/ca.crt"
IN_CLUSTER_CLIENT_CERT = f"{IN_CLUSTER_CLIENT_DIR}/tls.crt"
IN_CLUSTER_CLIENT_KEY = f"{IN_CLUSTER_CLIENT_DIR}/tls.key"


def kube_scheduler_configuration(url: str = IN_CLUSTER_URL, *, second_scheduler: bool = False,
                                 ca_file: str | None = IN_CLUSTER_CA, cert_file: str | None = IN_CLUSTER_CLIENT_CERT,
                                 key_file: str | None = IN_CLUSTER_CLIENT_KEY) -> dict[str, Any]:
    """The KubeSchedulerConfiguration a platform engineer deploys.

    Default (the cluster's own kube-scheduler): the stock `default-scheduler` profile is left as it is, and GPU pods
    scheduled by it go through gpuaas too (extenders serve every profile); a `gpuaas-scheduler` profile adds pure
    packing for pods that ask for it by schedulerName.
    `second_scheduler`: a separate kube-scheduler that only runs the `gpuaas-scheduler` profile, with its own lease,
    beside an untouched default scheduler (the way HAMi and Volcano are deployed)."""
    profiles = [gpuaas_profile(SECOND_SCHEDULER_NAME)]
    if not second_scheduler:
        profiles.insert(0, {"schedulerName": "default-scheduler"})
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "profiles": profiles,
        "extenders": extender_entries(url, ca_file=ca_file, cert_file=cert_file, key_file=key_file),
    }
    if second_scheduler:
        config["leaderElection"] = {"leaderElect": True, "resourceName": SECOND_SCHEDULER_NAME,
                                    "resourceNamespace": "gpuaas-system"}
    return config


def shipped_file(*, second_scheduler: bool = False) -> str:
    """The scheduler-config.yaml that deploy/ ships, header included: `python -m extender.schedconfig
    [--second-scheduler]` writes it, and the test suite compares the shipped files with it."""
    if second_scheduler:
        header = ("# Generated by `python -m extender.schedconfig --second-scheduler`: do not edit.\n"
                  "# The configuration of the second kube-scheduler (ConfigMap gpuaas-scheduler-config).\n")
    else:
        header = ("# Generated by `python -m extender.schedconfig`.\n"
                  "# For the cluster's own kube-scheduler: pass it with --config (kubeadm: the scheduler's static pod\n"
                  "# manifest), with the files of secret gpuaas-scheduler-extender-client at tlsConfig's paths: the\n"
                  "# extender's CA (ca.crt) and kube-scheduler's client certificate (tls.crt, tls.key; CN\n"
                  "# system:kube-scheduler), without which the extender answers 401.\n"
                  "# Set urlPrefix to the Service's ClusterIP where the control plane's host DNS cannot resolve"
                  " cluster\n"
                  "# names.\n")
    return header + yaml.safe_dump(kube_scheduler_configuration(second_scheduler=second_scheduler), sort_keys=False)


if __name__ == "__main__":
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m extender.schedconfig",
                                     description="Print the KubeSchedulerConfiguration deploy/ ships.")
    parser.add_argument("--second-scheduler", action="store_true",
                        help="the second kube-scheduler's (deploy/bases/second-scheduler), not the default one's "
                             "(deploy/overlays/default-scheduler)")
    sys.stdout.write(shipped_file(second_scheduler=parser.parse_args().second_scheduler))
