"""gpuaas's packing advantage over FGD, guarded on a small fixed trace (FGD's protocol, 130 % arrived).

The trace is generated here from fixed seeds, shaped like the Alibaba GPU trace v2023 (`openb_pod_list_default`):
pod kinds in its proportions (48 % one whole GPU, 38 % a GPU share, 13 % CPU only, 1 % two to eight GPUs), each
kind's most common CPU/memory requests and the eight most common share sizes, weighted by their counts; the cluster is
the trace's two main node types at their 3:2 ratio (G2: 8 GPUs, 96 cores, 384 GiB; T4: 2 GPUs, 104 cores, 512 GiB).
No file is read: the tables below are the fixture.

Measured (`allocation_at_130` for seeds 0-23): at 130 % arrived gpuaas allocates 96.10 % and FGD 95.51 % on average
(the full trace: 96.36 vs 95.39); the margin is +0.59 points per seed (sd 0.31, min +0.13, never negative), +0.61
over seeds 0-5, and the mean over any 6 of the 24 seeds was >= 0.36 in 99.9 % of 5,000 draws. The floor, 0.3 over
seeds 0-5, sits below that. Policies in gpuaas's place, margin over seeds 0-5: FGD itself 0.00, bestfit -0.63,
least-allocated -1.45, random -7.04, first-fit -11.13: each fails. It guards the advantage as a whole, not each term:
without the share regret (REGRET_WEIGHT = 0) the margin is +0.34 per seed, too close to the full policy's to tell
apart on six seeds.
"""
from __future__ import annotations

import numpy as np
import pytest

from scoring.model import NodeSpec, PodDemand
from scoring.simulation import simulate

# Pod kinds and their share of the trace's 8,152 pods: 3,911 one whole GPU, 3,078 a GPU share, 1,088 CPU only,
# 75 two, four or eight GPUs.
KINDS = {"whole": 0.48, "share": 0.38, "cpu": 0.13, "multi": 0.01}
# Per kind, (weight, cpu_milli, memory_mib, gpus, gpu_milli) rows: the kind's most common requests and their counts.
REQUESTS = {
    "whole": [(857, 11_300, 49_152, 1, 1000), (534, 11_400, 48_128, 1, 1000), (470, 3_152, 5_600, 1, 1000),
              (255, 18_708, 64_512, 1, 1000), (195, 9_810, 41_560, 1, 1000), (158, 12_000, 24_576, 1, 1000)],
    "cpu": [(364, 12_500, 57_344, 0, 0), (284, 32_000, 49_152, 0, 0), (163, 8_000, 30_517, 0, 0),
            (120, 15_400, 51_200, 0, 0)],
    "multi": [(16, 16_200, 66_560, 2, 1000), (15, 32_200, 132_096, 4, 1000), (44, 88_000, 327_680, 8, 1000)],
    # A share pod's CPU and memory; its size is drawn from SHARE_SIZES.
    "share": [(1122, 3_152, 5_600, 1, 0), (625, 11_908, 47_104, 1, 0), (486, 8_000, 30_517, 1, 0),
              (189, 4_000, 22_888, 1, 0)],
}
# (weight, gpu_milli): the eight most common share sizes and their counts.
SHARE_SIZES = [(1078, 810), (750, 470), (328, 320), (253, 650), (140, 230), (128, 460), (75, 590), (74, 160)]

NODES = ([NodeSpec(f"g2-{i:03d}", 96_000, 393_216, 8, "G2") for i in range(120)]
         + [NodeSpec(f"t4-{i:03d}", 104_000, 524_288, 2, "T4") for i in range(80)])  # 1,120 GPUs
TRACE_PODS = 600  # ~550 GPUs; FGD's protocol resamples it up to 130 % of capacity
SEEDS = range(6)
MIN_MARGIN = 0.3  # points of allocation ratio at 130 % arrived, mean over SEEDS


def _pick(rng: np.random.Generator, rows: list[tuple]) -> tuple:
    weights = np.array([row[0] for row in rows], dtype=float)
    return rows[int(rng.choice(len(rows), p=weights / weights.sum()))][1:]


def alibaba_like_trace(seed: int, n: int = TRACE_PODS) -> list[PodDemand]:
    rng = np.random.default_rng(seed)
    kinds = list(KINDS)
    p = np.array(list(KINDS.values()))
    pods = []
    for i in range(n):
        kind = kinds[int(rng.choice(len(kinds), p=p / p.sum()))]
        cpu, mem, gpus, milli = _pick(rng, REQUESTS[kind])
        if kind == "share":
            (milli,) = _pick(rng, SHARE_SIZES)
        pods.append(PodDemand(cpu_milli=cpu, memory_mib=mem, gpus=gpus, gpu_milli=milli, name=f"pod-{i}"))
    return pods


def allocation_at_130(policy: str, seed: int) -> float:
    return simulate(NODES, alibaba_like_trace(seed), policy, seed=42 + seed).allocation_ratio()["130"]


def test_fixture_is_shaped_like_the_trace():
    pods = [p for seed in SEEDS for p in alibaba_like_trace(seed)]
    share = np.mean([p.is_share for p in pods])
    cpu_only = np.mean([p.gpus == 0 for p in pods])
    multi = np.mean([p.gpus >= 2 for p in pods])
    # KINDS over 3,600 pods: binomial sd is at most 0.008, so 0.02 is 2.5 sd.
    assert share == pytest.approx(KINDS["share"], abs=0.02)
    assert cpu_only == pytest.approx(KINDS["cpu"], abs=0.02)
    assert multi == pytest.approx(KINDS["multi"], abs=0.01)


def test_gpuaas_allocates_more_than_fgd_at_130_percent_arrived():
    ours = np.array([allocation_at_130("gpuaas", s) for s in SEEDS])
    fgd = np.array([allocation_at_130("fgd", s) for s in SEEDS])
    margin = ours - fgd
    assert margin.mean() >= MIN_MARGIN, (
        f"gpuaas's margin over FGD at 130 % arrived fell to {margin.mean():.2f} points (floor {MIN_MARGIN}); "
        f"per seed: gpuaas {ours.round(2).tolist()}, fgd {fgd.round(2).tolist()}")
