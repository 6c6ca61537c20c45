"""GPU catalog and MIG geometry.

What a GPU model is (name, the `nvidia.com/gpu.product` label GPU feature discovery publishes, memory, MIG profiles),
where MIG instances may sit on a GPU, and the named layouts the GPU operator's MIG manager applies.

MIG geometry (NVIDIA MIG user guide, `nvidia-smi mig -lgipp`): a GPU has 8 memory slices; a GPU instance occupies
`memory_slices` consecutive slices starting at one of the profile's valid start slots, and instances may not overlap.
So the MIG state of one GPU is an 8-bit mask of memory slices in use (bit i = slice i). All four MIG models here share
the same placement shapes, so the per-mask tables below are computed once per shape and shared.
"""
from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

MEMORY_SLICES = 8
COMPUTE_SLICES = 7
FULL_MASK = (1 << MEMORY_SLICES) - 1
# The device plugin (mixed strategy) advertises one extended resource per profile under this prefix.
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


class UnknownGpuModelError(KeyError):
    """A GPU model name or product label that is not in the catalog."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "unknown GPU model"


class MigLayoutError(ValueError):
    """A MIG layout that cannot be realised on a GPU of the given model."""


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile, e.g. 3g.40gb: 3 compute slices, 40 GB, 4 memory slices starting at 0 or 4."""

    name: str
    compute_slices: int
    memory_gb: int
    memory_slices: int
    starts: tuple[int, ...]
    max_count: int
    media_extensions: bool = False

    @property
    def resource_name(self) -> str:
        """Extended resource the device plugin advertises in mixed strategy (`+me` is spelled `.me` there)."""
        return MIG_RESOURCE_PREFIX + self.name.replace("+", ".")

    def placement_mask(self, start: int) -> int:
        """Memory-slice mask of an instance of this profile starting at `start`."""
        return ((1 << self.memory_slices) - 1) << start

    @property
    def shape(self) -> tuple[int, tuple[int, ...]]:
        return (self.memory_slices, self.starts)


@dataclass(frozen=True)
class MigPlacement:
    """A GPU instance at a position: NVML's {start, size} plus the profile it realises."""

    profile: str
    start: int
    size: int

    @property
    def mask(self) -> int:
        return ((1 << self.size) - 1) << self.start


@dataclass(frozen=True)
class GpuModel:
    """A GPU model. `mig_profiles` is empty for GPUs without MIG."""

    name: str
    product: str
    memory_mib: int
    mig_profiles: Mapping[str, MigProfile] = field(default_factory=dict, hash=False, compare=False)
    # Other product labels and short names the same hardware goes by (PCIe variants, trace codes).
    aliases: tuple[str, ...] = ()
    description: str = ""

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    def mig_profile(self, name: str) -> MigProfile:
        """Profile by name; accepts the resource spelling too (`mig-1g.10gb`, `nvidia.com/mig-1g.10gb.me`)."""
        key = name.removeprefix("nvidia.com/").removeprefix("mig-")
        if key.endswith(".me"):
            key = key[: -len(".me")] + "+me"
        try:
            return self.mig_profiles[key]
        except KeyError:
            known = ", ".join(self.mig_profiles) or "none: the model has no MIG"
            raise MigLayoutError(f"MIG profile {name!r} does not exist on {self.name} (profiles: {known})") from None


def _mig_table(sizes: tuple[int, int, int, int, int, int]) -> Mapping[str, MigProfile]:
    """The profile table shared by A100/H100/H200, given the memory (GB) of 1g, 1g-double, 2g, 3g, 4g, 7g."""
    g1, g1x2, g2, g3, g4, g7 = sizes
    profiles = [
        MigProfile(f"1g.{g1}gb", 1, g1, 1, (0, 1, 2, 3, 4, 5, 6), 7),
        MigProfile(f"1g.{g1}gb+me", 1, g1, 1, (0, 1, 2, 3, 4, 5, 6), 1, media_extensions=True),
        MigProfile(f"1g.{g1x2}gb", 1, g1x2, 2, (0, 2, 4, 6), 4),
        MigProfile(f"2g.{g2}gb", 2, g2, 2, (0, 2, 4), 3),
        MigProfile(f"3g.{g3}gb", 3, g3, 4, (0, 4), 2),
        MigProfile(f"4g.{g4}gb", 4, g4, 4, (0,), 1),
        MigProfile(f"7g.{g7}gb", 7, g7, 8, (0,), 1),
    ]
    return MappingProxyType({p.name: p for p in profiles})


def _model(name: str, product: str, memory_mib: int, mig: Mapping[str, MigProfile] | None = None,
           aliases: tuple[str, ...] = (), description: str = "") -> GpuModel:
    return GpuModel(name, product, memory_mib, mig if mig is not None else MappingProxyType({}), tuple(aliases),
                    description)


_MODELS = (
    _model("A100-40GB", "NVIDIA-A100-SXM4-40GB", 40960, _mig_table((5, 10, 10, 20, 20, 40)),
           ("NVIDIA-A100-PCIE-40GB", "A100-SXM4-40GB", "A100")),
    _model("A100-80GB", "NVIDIA-A100-SXM4-80GB", 81920, _mig_table((10, 20, 20, 40, 40, 80)),
           ("NVIDIA-A100-80GB-PCIe", "A100-SXM4-80GB")),
    _model("H100-80GB", "NVIDIA-H100-80GB-HBM3", 81559, _mig_table((10, 20, 20, 40, 40, 80)),
           ("NVIDIA-H100-SXM5-80GB", "NVIDIA-H100-PCIe", "H100")),
    # H200 placements assumed equal to H100's (packing-anchors §3.1, unverified upstream).
    _model("H200-141GB", "NVIDIA-H200", 143771, _mig_table((18, 35, 35, 71, 71, 141)),
           ("NVIDIA-H200-141GB-HBM3", "H200")),
    _model("T4", "Tesla-T4", 15360, aliases=("NVIDIA-T4",)),
    _model("V100-16GB", "Tesla-V100-SXM2-16GB", 16160, aliases=("Tesla-V100-PCIE-16GB", "V100M16")),
    _model("V100-32GB", "Tesla-V100-SXM2-32GB", 32510, aliases=("Tesla-V100-PCIE-32GB", "V100M32")),
    _model("P100-16GB", "Tesla-P100-PCIE-16GB", 16280, aliases=("Tesla-P100-SXM2-16GB", "P100")),
    _model("A10", "NVIDIA-A10", 23028),
    _model("A10G", "NVIDIA-A10G", 23028),
    _model("L4", "NVIDIA-L4", 23034),
    _model("L40S", "NVIDIA-L40S", 46068),
    _model("A30", "NVIDIA-A30", 24576),  # MIG-capable (4 slices) but with a different geometry: not modelled
    # Alibaba 2023 trace codes whose hardware was not disclosed; memory unknown (0).
    _model("G1", "alibaba-G1", 0, description="undisclosed model in the Alibaba GPU trace v2023"),
    _model("G2", "alibaba-G2", 0, description="undisclosed model in the Alibaba GPU trace v2023"),
    _model("G3", "alibaba-G3", 0, description="undisclosed model in the Alibaba GPU trace v2023"),
)

GPU_MODELS: dict[str, GpuModel] = {m.name: m for m in _MODELS}

# The Alibaba 2023 trace's model codes -> catalog names (T4, A10, G1-G3 are already catalog names).
TRACE_MODEL_NAMES: dict[str, str] = {
    "G1": "G1", "G2": "G2", "G3": "G3", "T4": "T4", "A10": "A10",
    "P100": "P100-16GB", "V100M16": "V100-16GB", "V100M32": "V100-32GB",
}

_BY_KEY: dict[str, GpuModel] = {}
for _m in _MODELS:
    for _key in (_m.name, _m.product, *_m.aliases):
        _BY_KEY.setdefault(_key.lower(), _m)


SHARED_SUFFIX = "-SHARED"  # GFD's product label on a node whose GPUs are time-sliced or MPS-shared


def _hardware_product(product: str) -> str:
    # GFD in single strategy publishes e.g. "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"; the hardware is the prefix. With
    # time-slicing (or MPS) it appends "-SHARED" unless the resource is renamed: "Tesla-T4-SHARED" is a T4.
    head, sep, _ = product.partition("-MIG-")
    head = head if sep else product
    return head[: -len(SHARED_SUFFIX)] if head.upper().endswith(SHARED_SUFFIX) else head


def model_by_product(product_label: str) -> GpuModel | None:
    """The model whose `nvidia.com/gpu.product` label (or a known alias) this is, else None."""
    if not product_label:
        return None
    return _BY_KEY.get(_hardware_product(product_label.strip()).lower())


def get_model(name_or_product: str) -> GpuModel:
    """Model by catalog name, product label or alias; raises UnknownGpuModelError naming the known models."""
    model = model_by_product(name_or_product)
    if model is None:
        raise UnknownGpuModelError(
            f"unknown GPU model {name_or_product!r}; known models: {', '.join(GPU_MODELS)} "
            f"(or their nvidia.com/gpu.product labels)"
        )
    return model


# ---------------------------------------------------------------------------------------------------------------------
# Named layouts (NVIDIA/mig-parted config-default.yaml). A layout is {profile: count}; all-disabled means MIG mode off,
# all-enabled means MIG mode on with no instances. The same config name may mean different layouts per model.

def _named_layouts(model: GpuModel) -> dict[str, dict[str, int]]:
    profiles = model.mig_profiles
    layouts: dict[str, dict[str, int]] = {"all-disabled": {}, "all-enabled": {}}
    for p in profiles.values():
        if p.media_extensions:
            layouts["all-" + p.name.replace("+me", ".me")] = {p.name: 1}
        else:
            layouts["all-" + p.name] = {p.name: p.max_count}
    names = list(profiles)  # 1g, 1g+me, 1g-double, 2g, 3g, 4g, 7g
    layouts["all-balanced"] = {names[0]: 2, names[3]: 1, names[4]: 1}
    return layouts


MIG_CONFIGS: dict[str, dict[str, dict[str, int]]] = {}
"""config name -> model name -> layout {profile: count}, for the MIG-capable models."""
for _m in _MODELS:
    if _m.mig_capable:
        for _cfg, _layout in _named_layouts(_m).items():
            MIG_CONFIGS.setdefault(_cfg, {})[_m.name] = _layout


def mig_configs_for(model: GpuModel) -> dict[str, dict[str, int]]:
    """The named layouts that apply to this model (only all-disabled for non-MIG GPUs)."""
    if not model.mig_capable:
        return {"all-disabled": {}}
    return {cfg: per_model[model.name] for cfg, per_model in MIG_CONFIGS.items() if model.name in per_model}


def resolve_mig_layout(model: GpuModel, layout: str | Mapping[str, int]) -> tuple[MigPlacement, ...]:
    """Place a layout (config name or {profile: count}) on one GPU without overlap, or raise MigLayoutError.

    Among all valid placements, the one that leaves the most usable room for later instances wins (e.g. 5 x 1g.10gb +
    1g.20gb puts the 1g.20gb at slices 6-7, keeping slice 5 free for another 1g rather than stranding slice 7); ties go
    to the lowest starts."""
    key = layout if isinstance(layout, str) else tuple(dict(layout).items())
    try:
        return _resolve_mig_layout_cached(model, key)  # every GPU of a MIG pool, at every model rebuild
    except TypeError:  # a count that cannot be hashed: the uncached path names it
        return _resolve_mig_layout(model, key)


@functools.lru_cache(maxsize=4096)
def _resolve_mig_layout_cached(model: GpuModel, layout: str | tuple[tuple[str, int], ...]) -> tuple[MigPlacement, ...]:
    return _resolve_mig_layout(model, layout)


def _resolve_mig_layout(model: GpuModel, layout: str | tuple[tuple[str, int], ...]) -> tuple[MigPlacement, ...]:
    if isinstance(layout, str):
        configs = mig_configs_for(model)
        if layout not in configs:
            raise MigLayoutError(
                f"MIG config {layout!r} does not apply to {model.name}; known: {', '.join(configs)}"
            )
        counts = configs[layout]
    else:
        counts = dict(layout)
    wanted: list[MigProfile] = []
    for name, count in counts.items():
        if not isinstance(count, int) or count < 0:
            raise MigLayoutError(f"MIG profile {name!r} on {model.name}: count must be a non-negative integer, "
                                 f"got {count!r}")
        if count == 0:
            continue
        if not model.mig_capable:
            raise MigLayoutError(f"{model.name} does not support MIG; cannot place {count} x {name}")
        profile = model.mig_profile(name)
        if count > profile.max_count:
            raise MigLayoutError(
                f"{count} x {profile.name} on {model.name}: at most {profile.max_count} fit on one GPU"
            )
        wanted.extend([profile] * count)
    if not wanted:
        return ()
    compute = sum(p.compute_slices for p in wanted)
    if compute > COMPUTE_SLICES:
        raise MigLayoutError(
            f"layout {_describe(counts)} on {model.name} needs {compute} compute slices; a GPU has {COMPUTE_SLICES}"
        )
    memory = sum(p.memory_slices for p in wanted)
    if memory > MEMORY_SLICES:
        raise MigLayoutError(
            f"layout {_describe(counts)} on {model.name} needs {memory} memory slices; a GPU has {MEMORY_SLICES}"
        )
    wanted.sort(key=lambda p: (-p.memory_slices, -p.compute_slices, p.name))
    placed = _best_placement(model, wanted)
    if placed is None:
        raise MigLayoutError(
            f"layout {_describe(counts)} does not fit on {model.name}: no placement without overlapping memory slices"
        )
    return tuple(sorted(placed, key=lambda pl: pl.start))


def _describe(counts: Mapping[str, int]) -> str:
    return "{" + ", ".join(f"{n}: {c}" for n, c in counts.items() if c) + "}"


def _best_placement(model: GpuModel, profiles: list[MigProfile]) -> tuple[MigPlacement, ...] | None:
    return _best_placement_of(model, tuple(model.mig_profiles.values()), tuple(profiles))


@functools.lru_cache(maxsize=4096)
def _best_placement_of(model: GpuModel, all_profiles: tuple[MigProfile, ...],
                       profiles: tuple[MigProfile, ...]) -> tuple[MigPlacement, ...] | None:
    # Pure in its arguments (the model's profiles are part of the key: GpuModel's own hash leaves them out), and a
    # fleet repeats a handful of layouts on thousands of GPUs (the 5,000-node benchmark model: 0.42 -> 0.20-0.31 s).
    tables = mig_tables(model)
    # Room left: free memory slices still reachable by each profile, weighted by its size, summed over profiles.
    weights = np.array([p.memory_slices for p in all_profiles], dtype=np.int32)
    best: tuple[int, list[MigPlacement]] | None = None
    for placed, mask in _placements(list(profiles), 0, -1):
        room = int((tables.capacity[mask].astype(np.int32) * weights).sum())
        if best is None or room > best[0]:
            best = (room, placed)
    return None if best is None else tuple(best[1])


def _placements(profiles: list[MigProfile], mask: int,
                min_start: int) -> Iterator[tuple[list[MigPlacement], int]]:
    """Every non-overlapping placement of `profiles` (equal profiles in increasing start order: no permutations)."""
    if not profiles:
        yield [], mask
        return
    first, rest = profiles[0], profiles[1:]
    for start in first.starts:
        if start <= min_start:
            continue
        m = first.placement_mask(start)
        if mask & m:
            continue
        next_min = start if rest and rest[0].name == first.name else -1
        for tail, final in _placements(rest, mask | m, next_min):
            yield [MigPlacement(first.name, start, first.memory_slices), *tail], final


def layout_mask(placements: tuple[MigPlacement, ...] | list[MigPlacement]) -> int:
    """Occupancy mask of a set of placements; raises MigLayoutError if two overlap."""
    mask = 0
    for pl in placements:
        if mask & pl.mask:
            raise MigLayoutError(f"{pl.profile} at slice {pl.start} overlaps another instance")
        mask |= pl.mask
    return mask


# ---------------------------------------------------------------------------------------------------------------------
# Precomputed per-mask tables. Index profiles by their position in model.mig_profiles.

@dataclass(frozen=True)
class MigTables:
    """Lookup tables over the 256 occupancy masks of one GPU, for the profiles of one model (in catalog order).

    fit_starts[mask, p]   bit s set if profile p can start at slice s on a GPU whose in-use mask is `mask`
    first_start[mask, p]  lowest such s, or -1
    capacity[mask, p]     how many more instances of p alone could be added to `mask`
    reachable[mask]       True if some set of non-overlapping instances produces exactly `mask`
    """

    profiles: tuple[str, ...]
    fit_starts: np.ndarray
    first_start: np.ndarray
    capacity: np.ndarray
    reachable: np.ndarray


@functools.cache
def _tables_for_shapes(shapes: tuple[tuple[int, tuple[int, ...]], ...]) -> tuple[np.ndarray, ...]:
    n = len(shapes)
    fit = np.zeros((256, n), dtype=np.uint8)
    first = np.full((256, n), -1, dtype=np.int8)
    cap = np.zeros((256, n), dtype=np.int8)
    for mask in range(256):
        for p, (size, starts) in enumerate(shapes):
            bits = 0
            for s in starts:
                if not mask & (((1 << size) - 1) << s):
                    bits |= 1 << s
            fit[mask, p] = bits
            first[mask, p] = (bits & -bits).bit_length() - 1 if bits else -1
            # Greedy lowest-start is optimal for one shape: the starts are aligned to the size or, for size-1, dense.
            m, c = mask, 0
            for s in starts:
                pm = ((1 << size) - 1) << s
                if not m & pm:
                    m |= pm
                    c += 1
            cap[mask, p] = c
    reachable = np.zeros(256, dtype=bool)
    reachable[0] = True
    frontier = [0]
    while frontier:
        nxt = []
        for mask in frontier:
            for size, starts in shapes:
                for s in starts:
                    pm = ((1 << size) - 1) << s
                    if not mask & pm and not reachable[mask | pm]:
                        reachable[mask | pm] = True
                        nxt.append(mask | pm)
        frontier = nxt
    for arr in (fit, first, cap, reachable):
        arr.setflags(write=False)
    return fit, first, cap, reachable


def mig_tables(model: GpuModel) -> MigTables:
    """Per-mask lookup tables for a MIG-capable model (cached; the four MIG models share one geometry)."""
    if not model.mig_capable:
        raise MigLayoutError(f"{model.name} does not support MIG")
    profiles = tuple(model.mig_profiles.values())
    fit, first, cap, reachable = _tables_for_shapes(tuple(p.shape for p in profiles))
    return MigTables(tuple(p.name for p in profiles), fit, first, cap, reachable)
