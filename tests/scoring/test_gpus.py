"""MIG geometry and GPU catalog, checked against the lgipp table (packing-anchors §3.1) and mig-parted's named
configs."""
import pytest

from scoring.gpus import (
    FULL_MASK,
    GPU_MODELS,
    MIG_CONFIGS,
    MigLayoutError,
    MigPlacement,
    UnknownGpuModelError,
    get_model,
    layout_mask,
    mig_configs_for,
    mig_tables,
    model_by_product,
    resolve_mig_layout,
)

MIG_MODELS = ["A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB"]


@pytest.mark.parametrize(
    "label, expected",
    [
        ("NVIDIA-A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA-H100-80GB-HBM3", "H100-80GB"),
        ("NVIDIA-A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA-H200", "H200-141GB"),
        ("Tesla-T4", "T4"),
        # GFD single strategy appends -MIG-<profile>; the hardware is still an A100-40GB.
        ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "A100-40GB"),
        # Alibaba trace codes.
        ("V100M16", "V100-16GB"),
        ("V100M32", "V100-32GB"),
        ("P100", "P100-16GB"),
        ("G2", "G2"),
        ("nvidia-a100-sxm4-80gb", "A100-80GB"),
        ("Radeon-MI300X", None),
        ("", None),
    ],
)
def test_model_by_product(label, expected):
    model = model_by_product(label)
    assert (model.name if model else None) == expected


def test_get_model_unknown_names_known_models():
    with pytest.raises(KeyError) as info:
        get_model("B300")
    assert isinstance(info.value, UnknownGpuModelError)
    message = str(info.value)
    assert "B300" in message and "A100-80GB" in message and "H200-141GB" in message


@pytest.mark.parametrize(
    "model, profile, compute, memory_gb, slices, starts, max_count",
    [
        # One row per lgipp line; A100-80GB and H100-80GB share names.
        ("A100-40GB", "1g.5gb", 1, 5, 1, (0, 1, 2, 3, 4, 5, 6), 7),
        ("A100-40GB", "1g.10gb", 1, 10, 2, (0, 2, 4, 6), 4),
        ("A100-40GB", "2g.10gb", 2, 10, 2, (0, 2, 4), 3),
        ("A100-40GB", "3g.20gb", 3, 20, 4, (0, 4), 2),
        ("A100-40GB", "4g.20gb", 4, 20, 4, (0,), 1),
        ("A100-40GB", "7g.40gb", 7, 40, 8, (0,), 1),
        ("A100-80GB", "1g.10gb", 1, 10, 1, (0, 1, 2, 3, 4, 5, 6), 7),
        ("A100-80GB", "1g.20gb", 1, 20, 2, (0, 2, 4, 6), 4),
        ("H100-80GB", "3g.40gb", 3, 40, 4, (0, 4), 2),
        ("H100-80GB", "7g.80gb", 7, 80, 8, (0,), 1),
        ("H200-141GB", "1g.18gb", 1, 18, 1, (0, 1, 2, 3, 4, 5, 6), 7),
        ("H200-141GB", "1g.35gb", 1, 35, 2, (0, 2, 4, 6), 4),
        ("H200-141GB", "2g.35gb", 2, 35, 2, (0, 2, 4), 3),
        ("H200-141GB", "3g.71gb", 3, 71, 4, (0, 4), 2),
        ("H200-141GB", "4g.71gb", 4, 71, 4, (0,), 1),
        ("H200-141GB", "7g.141gb", 7, 141, 8, (0,), 1),
    ],
)
def test_profile_table(model, profile, compute, memory_gb, slices, starts, max_count):
    p = GPU_MODELS[model].mig_profiles[profile]
    assert (p.compute_slices, p.memory_gb, p.memory_slices, p.starts, p.max_count) == (
        compute, memory_gb, slices, starts, max_count)


def test_profile_resource_names():
    m = GPU_MODELS["A100-80GB"]
    assert m.mig_profiles["1g.10gb"].resource_name == "nvidia.com/mig-1g.10gb"
    assert m.mig_profiles["1g.10gb+me"].resource_name == "nvidia.com/mig-1g.10gb.me"
    assert m.mig_profile("nvidia.com/mig-3g.40gb").name == "3g.40gb"
    assert m.mig_profile("mig-1g.10gb.me").name == "1g.10gb+me"


def test_non_mig_models_have_no_profiles():
    for name in ("T4", "V100-16GB", "V100-32GB", "A10", "L4", "L40S", "G2", "G3", "P100-16GB"):
        assert not GPU_MODELS[name].mig_capable, name


@pytest.mark.parametrize(
    "model, config, expected",
    [
        # 2g at 0-1, the two 1g at 2 and 3, the 3g at 4-7: 3g at 0 would leave slice 7, where no 1g can start.
        ("A100-80GB", "all-balanced",
         [("2g.20gb", 0, 2), ("1g.10gb", 2, 1), ("1g.10gb", 3, 1), ("3g.40gb", 4, 4)]),
        ("A100-40GB", "all-balanced",
         [("2g.10gb", 0, 2), ("1g.5gb", 2, 1), ("1g.5gb", 3, 1), ("3g.20gb", 4, 4)]),
        ("H200-141GB", "all-balanced",
         [("2g.35gb", 0, 2), ("1g.18gb", 2, 1), ("1g.18gb", 3, 1), ("3g.71gb", 4, 4)]),
        # mig-parted: all-1g.10gb is 4 two-slice instances on A100-40GB but 7 one-slice ones on 80 GB parts.
        ("A100-40GB", "all-1g.10gb", [("1g.10gb", s, 2) for s in (0, 2, 4, 6)]),
        ("H100-80GB", "all-1g.10gb", [("1g.10gb", s, 1) for s in range(7)]),
        ("H100-80GB", "all-3g.40gb", [("3g.40gb", 0, 4), ("3g.40gb", 4, 4)]),
        ("H100-80GB", "all-7g.80gb", [("7g.80gb", 0, 8)]),
        ("H100-80GB", "all-disabled", []),
        ("T4", "all-disabled", []),
        # Mapping form: 4g + 2g + 1g is the classic 7-compute-slice mix.
        ("A100-80GB", {"4g.40gb": 1, "2g.20gb": 1, "1g.10gb": 1},
         [("4g.40gb", 0, 4), ("2g.20gb", 4, 2), ("1g.10gb", 6, 1)]),
        ("A100-80GB", {"3g.40gb": 1, "4g.40gb": 1}, [("4g.40gb", 0, 4), ("3g.40gb", 4, 4)]),
        ("A100-80GB", {"1g.20gb": 0}, []),
    ],
)
def test_resolve_mig_layout(model, config, expected):
    placements = resolve_mig_layout(GPU_MODELS[model], config)
    assert [(p.profile, p.start, p.size) for p in placements] == expected
    layout_mask(placements)  # raises on overlap


@pytest.mark.parametrize(
    "model, layout, fragment",
    [
        ("A100-80GB", {"foo.1gb": 1}, "'foo.1gb' does not exist on A100-80GB"),
        ("A100-80GB", {"1g.5gb": 1}, "'1g.5gb' does not exist on A100-80GB"),
        ("A100-80GB", {"3g.40gb": 3}, "at most 2 fit"),
        ("A100-80GB", {"1g.10gb+me": 2}, "at most 1 fit"),
        # 3 + 3 + 2 = 8 compute slices > 7.
        ("A100-80GB", {"3g.40gb": 2, "2g.20gb": 1}, "8 compute slices"),
        # 4 + 3 + 1 = 8 compute slices (and 4 + 4 + 2 = 10 memory slices): compute is checked first.
        ("A100-80GB", {"4g.40gb": 1, "3g.40gb": 1, "1g.20gb": 1}, "8 compute slices"),
        # 1g.20gb x4 = 8 slices, plus a 1g = 9 > 8 memory slices (compute 5 is fine).
        ("A100-80GB", {"1g.20gb": 4, "1g.10gb": 1}, "9 memory slices"),
        # Two 2g plus a 4g: 2+2+4 = 8 slices and 8 compute... compute check fires first.
        ("H100-80GB", {"4g.40gb": 1, "2g.20gb": 2}, "8 compute slices"),
        # 7 compute and 8 memory slices, but 1g.20gb can only start at 0,2,4,6 and 3g at 0,4:
        # 3g at 0 or 4 leaves 4 slices; 2g(2)+1g.20gb(2) would fill them but 2g starts only at 0,2,4.
        ("A100-80GB", {"3g.40gb": 1, "1g.20gb": 1, "2g.20gb": 1, "1g.10gb": 0}, None),
        ("T4", {"1g.5gb": 1}, "T4 does not support MIG"),
        ("A100-80GB", "all-1g.5gb", "'all-1g.5gb' does not apply to A100-80GB"),
        ("A100-80GB", {"1g.10gb": -1}, "non-negative"),
    ],
)
def test_resolve_mig_layout_errors(model, layout, fragment):
    if fragment is None:
        # 3g(4-7) + 2g(0-1) + 1g.20gb(2-3) is valid: this row documents that the search finds it.
        assert layout_mask(resolve_mig_layout(GPU_MODELS[model], layout)) == FULL_MASK
        return
    with pytest.raises(MigLayoutError) as info:
        resolve_mig_layout(GPU_MODELS[model], layout)
    assert fragment in str(info.value)
    assert isinstance(info.value, ValueError)


def test_unplaceable_layout_names_reason():
    # 1g.20gb x3 takes 6 slices at 0,2,4 (or any three of 0,2,4,6); a 3g needs an aligned free block of 4 (0-3 or 4-7).
    # 3 + 3 = 6 compute, 6 + 4 = 10 memory slices > 8 -> memory check.
    with pytest.raises(MigLayoutError, match="memory slices"):
        resolve_mig_layout(GPU_MODELS["A100-80GB"], {"1g.20gb": 3, "3g.40gb": 1})
    # 2g x2 (4 slices) + 3g (4 slices) = 8 slices, 7 compute, but 2g starts only at 0,2,4: the 3g must take 0-3 or
    # 4-7; with 3g at 4 the 2g go to 0 and 2 -- valid. So this one fits.
    assert len(resolve_mig_layout(GPU_MODELS["A100-80GB"], {"2g.20gb": 2, "3g.40gb": 1})) == 3
    # 1g.10gb x7 fills 0-6; a 1g.20gb needs an even start with two free slices: only 6-7, taken by the 7th 1g.
    # 7 + 1 = 8 compute slices -> rejected on compute before placement.
    with pytest.raises(MigLayoutError, match="compute"):
        resolve_mig_layout(GPU_MODELS["A100-80GB"], {"1g.10gb": 7, "1g.20gb": 1})
    # 1g.10gb x5 + 1g.20gb: 6 compute, 7 slices. 1g.20gb at 6 (6-7), the five 1g at 0-4 -> fits.
    assert layout_mask(resolve_mig_layout(GPU_MODELS["A100-80GB"], {"1g.10gb": 5, "1g.20gb": 1})) == 0b11011111
    # 1g.10gb x6 + 1g.20gb: 7 compute, 8 slices; 1g.20gb at 6, the six 1g at 0-5 -> full.
    assert layout_mask(resolve_mig_layout(GPU_MODELS["A100-80GB"], {"1g.10gb": 6, "1g.20gb": 1})) == FULL_MASK
    # 2g x3 + 1g.20gb: 7 compute, 8 slices; 2g at 0,2,4 and 1g.20gb at 6 -> full.
    assert layout_mask(resolve_mig_layout(GPU_MODELS["A100-80GB"], {"2g.20gb": 3, "1g.20gb": 1})) == FULL_MASK
    # 4g + 1g.20gb x2: 6 compute, 8 slices: 4g at 0, 1g.20gb at 4 and 6.
    assert layout_mask(resolve_mig_layout(GPU_MODELS["A100-80GB"], {"4g.40gb": 1, "1g.20gb": 2})) == FULL_MASK
    # 3g x1 + 2g x2 on slices: 3g must be at 0 or 4. At 0: 2g at 4 only (2g starts 0,2,4) -> one 2g; at 4: 2g at 0,2.
    # So the search has to backtrack from start 0 to start 4 for the 3g.
    got = resolve_mig_layout(GPU_MODELS["A100-80GB"], {"3g.40gb": 1, "2g.20gb": 2})
    assert [(p.profile, p.start) for p in got] == [("2g.20gb", 0), ("2g.20gb", 2), ("3g.40gb", 4)]


def test_overlap_detected_in_layout_mask():
    with pytest.raises(MigLayoutError, match="overlaps"):
        layout_mask([MigPlacement("3g.40gb", 0, 4), MigPlacement("2g.20gb", 2, 2)])


def test_mig_configs_cover_all_mig_models():
    for name in MIG_MODELS:
        configs = mig_configs_for(GPU_MODELS[name])
        assert {"all-disabled", "all-enabled", "all-balanced"} <= set(configs)
        for cfg in configs:  # every named layout must actually fit
            resolve_mig_layout(GPU_MODELS[name], cfg)
    assert MIG_CONFIGS["all-1g.10gb"] == {
        "A100-40GB": {"1g.10gb": 4}, "A100-80GB": {"1g.10gb": 7}, "H100-80GB": {"1g.10gb": 7}}
    assert mig_configs_for(GPU_MODELS["L4"]) == {"all-disabled": {}}


def test_mig_tables():
    t = mig_tables(GPU_MODELS["A100-80GB"])
    p = {name: i for i, name in enumerate(t.profiles)}
    # 192 distinct occupancy masks are reachable (packing-anchors §3.1 [derived], confirmed by this BFS).
    assert int(t.reachable.sum()) == 192
    assert not t.reachable[0b10000000]  # slice 7 alone: only 1g.20gb@6, 3g@4, 7g@0 cover it, and all cover more
    # Empty GPU: 7 x 1g, 4 x 1g.20gb, 3 x 2g, 2 x 3g, 1 x 4g, 1 x 7g.
    assert [int(t.capacity[0, p[n]]) for n in ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")] == [
        7, 4, 3, 2, 1, 1]
    # Slice 0 used (mask 0b1): 1g can start at 1..6 (bits 1-6 = 0b01111110), 2g only at 2 and 4, 3g only at 4, no 4g.
    assert int(t.fit_starts[0b1, p["1g.10gb"]]) == 0b01111110
    assert int(t.fit_starts[0b1, p["2g.20gb"]]) == 0b00010100
    assert int(t.first_start[0b1, p["3g.40gb"]]) == 4
    assert int(t.first_start[0b1, p["4g.40gb"]]) == -1
    assert int(t.capacity[0b1, p["2g.20gb"]]) == 2
    # Full GPU: nothing fits anywhere.
    assert int(t.fit_starts[FULL_MASK].sum()) == 0
    with pytest.raises(MigLayoutError):
        mig_tables(GPU_MODELS["T4"])
