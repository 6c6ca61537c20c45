"""Whether a pod fits a node now, and why not: the one source of the fit rules and of their words.

`feasible` answers for every node at once (the Filter every placement starts from); `misfit_reasons` says, for the
nodes that fail, which rule failed and in what words (the extender's FailedNodes and /explain); both apply the same
per-dimension rules below, so what the filter refuses and what the explanation says never part.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

from scoring.dra import SHARE_CLASS
from scoring.kubeobjects import GPU_RESOURCE, REPLICAS_LABEL, SHARE_RESOURCE
from scoring.model import MILLI, ClusterState, PodDemand
from scoring.rowwise import any_per_row, count_per_row

# What a pod asking gpuaas.io/gpu-share hears from a node whose device plugins give no such share (structural).
NO_SHARE_PLUGIN = (f"node cannot give a {SHARE_RESOURCE} share: no device plugin on it advertises {SHARE_RESOURCE}, so "
                   f"the kubelet would start the pod without a GPU (the NVIDIA device plugin hands out whole GPUs and "
                   f"MIG instances only); ask for {GPU_RESOURCE}: 1, or for a share through a ResourceClaim of class "
                   f"{SHARE_CLASS} on a DRA node (docs/devices.md)")

# What a pod hears from a node whose GPUs reach pods the other way (scoring.model, "Channels"; structural).
DRA_NODE = ("node's GPUs are DRA devices (ResourceSlices), given to ResourceClaims only: ask through a ResourceClaim "
            f"(docs/devices.md), not {GPU_RESOURCE}, nvidia.com/mig-<profile> or {SHARE_RESOURCE}")
PLUGIN_NODE = ("node's GPUs are the device plugin's extended resources: a pod asking through ResourceClaims is "
               "allocated DRA devices only")

# -- the rules, as bool[N] over every node, or bool[len(rows)] over the model rows given ----------------------------

Rows = NDArray[np.int64] | None  # model rows to judge; None: every node


def _at(values: np.ndarray, rows: Rows) -> np.ndarray:
    return values if rows is None else values[rows]


def cpu_fits(state: ClusterState, pod: PodDemand, rows: Rows = None) -> NDArray[np.bool_]:
    fits: NDArray[np.bool_] = _at(state.cpu_left, rows) >= pod.cpu_milli
    return fits


def memory_fits(state: ClusterState, pod: PodDemand, rows: Rows = None) -> NDArray[np.bool_]:
    fits: NDArray[np.bool_] = _at(state.mem_left, rows) >= pod.memory_mib
    return fits


def devices_fit(state: ClusterState, pod: PodDemand, rows: Rows = None) -> NDArray[np.bool_]:
    """`_devices_fit` on the nodes whose GPUs reach the pod the way it asks (scoring.model, "Channels"): DRA nodes for
    a pod asking through claims, the others for extended resources."""
    fits = _devices_fit(state, pod, rows)
    if state.any_dra or pod.claims:
        ours: NDArray[np.bool_] = fits & (_at(state.dra_rows, rows) == pod.claims)
        return ours
    return fits


def _devices_fit(state: ClusterState, pod: PodDemand, rows: Rows = None) -> NDArray[np.bool_]:
    """Free devices of the kind the pod asks (a free MIG instance of its profile, a GPU with its share free, or that
    many nvidia.com/gpu devices: wholly free GPUs, or free replicas on a time-sliced node), whatever the GPU model.
    A GPU share gpuaas accounts fits only the nodes that can give one (`ClusterState.share_nodes`: not time-sliced,
    and a device plugin advertising gpuaas.io/gpu-share; see `shares_refused`). Only for pods that ask for GPUs."""
    if pod.mig_profile:
        col = state.mig_pos.get(pod.mig_profile)
        if col is None:  # no GPU of the cluster has that profile
            return np.zeros(len(state) if rows is None else len(rows), dtype=bool)
        return any_per_row(_at(state.mig_free[:, :, col], rows) > 0)
    gpu_left = _at(state.gpu_left, rows)
    if not pod.takes_replicas:
        fits = any_per_row(gpu_left >= pod.gpu_milli)
        return fits if state.all_share_nodes else fits & _at(state.share_nodes, rows)
    if state.any_time_sliced:
        return state.free_replicas(rows) >= pod.gpus
    return count_per_row(gpu_left == MILLI) >= pod.gpus


def shares_refused(pod: PodDemand) -> bool:
    """The pod asks for a GPU share gpuaas accounts (`gpuaas.io/gpu-share`, or a trace's fractional pod), which a
    time-sliced node cannot give (its device plugin hands out whole replicas of nvidia.com/gpu and nothing else), nor
    a node whose device plugins do not advertise gpuaas.io/gpu-share (the kubelet would start the pod without a GPU)."""
    return bool(pod.gpus) and not pod.mig_profile and not pod.takes_replicas


def feasible(state: ClusterState, pod: PodDemand, rows: Rows = None) -> NDArray[np.bool_]:
    """bool[N] (bool[len(rows)] for `rows`): the pod fits on the node now (CPU, memory, GPU model, GPUs/share/MIG
    instance)."""
    ok = cpu_fits(state, pod, rows) & memory_fits(state, pod, rows)
    if pod.gpus == 0:
        return ok
    fits: NDArray[np.bool_] = ok & _at(state.model_allowed(pod), rows) & devices_fit(state, pod, rows)
    return fits


# -- the words ---------------------------------------------------------------------------------------------------------

def misfit_reasons(state: ClusterState, pod: PodDemand, rows: np.ndarray) -> tuple[np.ndarray, list[str], int]:
    """Why each node (model row) cannot take the pod now, for all rows at once: (code per row, message per code,
    first resolvable code). Code 0 means it fits. Codes below the third value are structural (no GPUs, a model the
    pod refuses, a MIG profile its GPU model does not have, fewer GPUs than asked): no waiting or preemption fixes
    them, and they go to FailedAndUnresolvableNodes, which preemption skips. Messages are shared per code so that
    answering for thousands of nodes costs array work, not string formatting per node."""
    messages = [""]
    code = np.zeros(len(rows), dtype=np.int64)

    def mark(condition: np.ndarray, message: str) -> None:
        free = (code == 0) & condition
        if free.any():
            code[free] = len(messages)
            messages.append(message)

    gpus = state.gpu_count[rows]
    model = state.model_idx[rows]
    # Time-sliced rows, for the pods whose devices time-slicing changes (None when no row is, the usual case).
    sliced = state.time_sliced[rows] if state.any_time_sliced and pod.gpus and not pod.mig_profile else None
    replicas = state.replicas[rows]
    if pod.gpus:
        mark(gpus == 0, "node has no GPUs")
        if state.any_dra or pod.claims:
            dra = state.dra_rows[rows]
            mark(dra & (not pod.claims), DRA_NODE)
            mark(~dra & pod.claims, PLUGIN_NODE)
        if sliced is not None and shares_refused(pod):
            for r in present(replicas[sliced]):
                mark(sliced & (replicas == r), f"node time-slices its GPUs ({REPLICAS_LABEL}={r}): its device plugin "
                     f"hands out replicas of {GPU_RESOURCE} only, not a {SHARE_RESOURCE} share; ask for "
                     f"{GPU_RESOURCE}: 1 for one replica (1/{r} of a GPU)")
        if not state.all_share_nodes and shares_refused(pod):
            mark(~state.share_nodes[rows] & ~state.time_sliced[rows], NO_SHARE_PLUGIN)
        allowed = state.model_allowed(pod)[rows]
        for m, gm in enumerate(state.models if pod.allowed_models or pod.mig_profile else ()):
            on_model = model == m
            mark(on_model & ~allowed, f"GPU model {gm.name} is not one the pod accepts "
                                      f"({', '.join(sorted(pod.allowed_models))})")
            if pod.mig_profile and pod.mig_profile not in gm.mig_profiles:
                known = ", ".join(p for p in gm.mig_profiles if "+" not in p) or "none"
                mark(on_model, f"no MIG layout of {gm.name} has a {pod.mig_profile} instance (its profiles: {known})")
        if pod.takes_replicas:
            if sliced is not None:  # the node's nvidia.com/gpu devices are its replicas
                short = sliced & (gpus * replicas < pod.gpus)
                for r in present(replicas[short]):
                    for n in present(gpus[short & (replicas == r)]):
                        mark(short & (replicas == r) & (gpus == n), f"pod asks for {pod.gpus} {GPU_RESOURCE}, the node "
                             f"has {n * r}: {n} GPU{'' if n == 1 else 's'} time-sliced into {r} replicas each "
                             f"({REPLICAS_LABEL}={r})")
            few = (gpus < pod.gpus) if sliced is None else (gpus < pod.gpus) & ~sliced
            for n in present(gpus[few]):
                mark(few & (gpus == n), f"pod asks for {pod.gpus} GPUs, the node has {n}")
    resolvable = len(messages)
    mark(~_judged(cpu_fits, state, pod, rows), f"insufficient cpu ({pod.cpu_milli}m requested)")
    mark(~_judged(memory_fits, state, pod, rows), f"insufficient memory ({pod.memory_mib}Mi requested)")
    if pod.gpus:
        fits = _judged(devices_fit, state, pod, rows)
        if pod.mig_profile:
            mark(~fits, f"no free MIG instance {pod.mig_profile}")
        elif not pod.takes_replicas:
            mark(~fits, f"no GPU with {pod.gpu_milli}/1000 free")
        elif not fits.all():  # the words of a shortage, only where there is one
            if sliced is not None:
                free = state.free_replicas(rows)
                short = ~fits & sliced
                for r in present(replicas[short]):
                    for n in present(free[short & (replicas == r)]):
                        mark(short & (replicas == r) & (free == n), f"insufficient GPU replicas: {n} free, {pod.gpus} "
                             f"requested ({REPLICAS_LABEL}={r}: each of the node's GPUs is {r} replicas)")
            whole_free = count_per_row(state.gpu_left == MILLI)[rows]  # per node, then gathered: no [rows, G] copy
            for n in present(whole_free[~fits]):
                mark(~fits & (whole_free == n), f"insufficient whole GPUs: {n} free, {pod.gpus} requested")
    return code, messages, resolvable


def _judged(rule: Callable[[ClusterState, PodDemand, Rows], NDArray[np.bool_]], state: ClusterState, pod: PodDemand,
            rows: NDArray[np.int64]) -> NDArray[np.bool_]:
    """A rule's answer for `rows`: judged on those rows alone when they are few (bind's one node, a plan's update),
    else on every node and then gathered, which costs less than copying the [rows, G] arrays of most of the cluster."""
    if len(rows) * 8 < len(state):
        return rule(state, pod, rows)
    return rule(state, pod, None)[rows]


def misfit_reason(state: ClusterState, pod: PodDemand, node: int) -> str | None:
    """Why the pod does not fit on one node (None if it does), in `misfit_reasons`' words."""
    code, messages, _ = misfit_reasons(state, pod, np.array([node]))
    return messages[int(code[0])] or None


def free_on(state: ClusterState, node: int) -> dict[str, int]:
    """What one node has free now, the numbers behind a misfit (for /explain)."""
    free = {"cpu_milli": int(state.cpu_left[node]), "memory_mib": int(state.mem_left[node]),
            "whole_gpus": int((state.gpu_left[node] == MILLI).sum()),
            "largest_gpu_share_milli": int(state.gpu_left[node].max()) if state.gpu_left.shape[1] else 0}
    if state.time_sliced[node]:
        free["gpu_replicas"] = int(state.free_replicas(np.array([node]))[0])
    return free


def present(counts: np.ndarray) -> list[int]:
    """The distinct values of small non-negative integers (GPU counts), ascending; bincount beats np.unique here."""
    return np.flatnonzero(np.bincount(counts)).tolist() if counts.size else []
