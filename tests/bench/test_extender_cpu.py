"""bench/extender_cpu.py's comparison of the schemes for pods that ask for no GPU: the calls kube-scheduler would make
per pod in each, and that the CPU-pod entry is what places such pods."""
from __future__ import annotations

import asyncio

import pytest

from bench.extender_cpu import SCHEMES, make_pods, run


def test_without_cpu_only_pods_the_pods_are_those_the_bench_always_drew():
    pods = make_pods(30, 1, 0.0)
    assert not any(cpu_only for cpu_only, _ in pods)
    assert make_pods(30, 1, 0.0) == pods


@pytest.mark.parametrize("decide_in_filter", [True, False])
@pytest.mark.parametrize("scheme", SCHEMES)
def test_each_scheme_binds_every_pod_and_counts_its_calls(scheme, decide_in_filter):
    out = asyncio.run(run(20, 60, 0, 3, scheme, 0.3, decide_in_filter=decide_in_filter))
    cpu_only = out["cpu_only_pods"]
    gpu = 60 - cpu_only
    assert 0 < cpu_only < 60
    assert out["bound"] == 60
    # The CPU-pods entry: its filter and prioritize for every pod (prioritize only, before it had a filter). With
    # decide_in_filter a GPU pod's filter leaves one node, and kube-scheduler calls no prioritize of either entry.
    gpu_calls = {"gpu_entry_only": 3, "cpu_pods_entry_prioritize_only": 4, "cpu_pods_entry": 5, "all_pods": 3}[scheme]
    if decide_in_filter:
        gpu_calls = {"gpu_entry_only": 2, "cpu_pods_entry_prioritize_only": 2, "cpu_pods_entry": 3,
                     "all_pods": 2}[scheme]
    cpu_calls = {"gpu_entry_only": 0, "cpu_pods_entry_prioritize_only": 1, "cpu_pods_entry": 2, "all_pods": 3}[scheme]
    assert out["extender_calls_per_pod"] == round((gpu * gpu_calls + cpu_only * cpu_calls) / 60, 3)


def test_deciding_in_filter_places_every_pod_where_prioritize_would_have():
    out = asyncio.run(run(40, 120, 0, 3, decide_in_filter=True))
    assert out["extender_calls_per_pod"] == 2 and out["reply_bytes_per_gpu_pod"]["prioritize"] == 0
    assert out["placements_digest"] == asyncio.run(run(40, 120, 0, 3, decide_in_filter=False))["placements_digest"]


def test_the_cpu_pod_entry_places_cpu_only_pods_where_gpuaas_ranks_them():
    # gpu_entry_only leaves them to kube-scheduler (here: the nodes in turn); the other two rank them.
    digests = {s: asyncio.run(run(20, 60, 0, 3, s, 0.3))["placements_digest"] for s in SCHEMES}
    assert digests["cpu_pods_entry"] != digests["gpu_entry_only"]
    assert digests["cpu_pods_entry"] == digests["all_pods"] == digests["cpu_pods_entry_prioritize_only"]
