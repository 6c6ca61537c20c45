"""Reading cluster and pod CSVs (the Alibaba GPU trace v2023 "openb" format) into the scoring model.

Node CSV columns: sn, cpu_milli, memory_mib, gpu, model.  Pod CSV columns: name, cpu_milli, memory_mib, num_gpu,
gpu_milli[, gpu_spec, ...].  Every error names the file, the line and the field.
"""
from __future__ import annotations

import csv
from pathlib import Path

from scoring.gpus import TRACE_MODEL_NAMES, UnknownGpuModelError, get_model
from scoring.model import MAX_GPUS_PER_NODE, MILLI, NodeSpec, PodDemand

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")


class TraceError(ValueError):
    """A CSV row that cannot be turned into the model."""


def _model_name(code: str) -> str:
    # Trace codes (V100M16, P100, G2) and catalog names / product labels are both accepted.
    return get_model(TRACE_MODEL_NAMES.get(code, code)).name


def _int(row: dict, field: str, where: str) -> int:
    raw = (row.get(field) or "").strip()
    try:
        value = int(raw)
    except ValueError:
        try:
            number = float(raw)
        except ValueError:
            raise TraceError(f"{where}: field {field!r} must be a number, got {raw!r}") from None
        if number != int(number):
            raise TraceError(f"{where}: field {field!r} must be a whole number, got {raw!r}") from None
        value = int(number)
    if value < 0:
        raise TraceError(f"{where}: field {field!r} must not be negative, got {raw!r}")
    return value


def _rows(path: Path, required: tuple[str, ...]):
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(f"{path}: missing column(s) {', '.join(missing)} (header: {reader.fieldnames})")
        for row in reader:
            yield f"{path}:{reader.line_num}", row


def load_nodes(path: str | Path) -> list[NodeSpec]:
    path = Path(path)
    nodes = []
    for where, row in _rows(path, NODE_COLUMNS):
        name = (row.get("sn") or "").strip()
        if not name:
            raise TraceError(f"{where}: field 'sn' is empty")
        gpus = _int(row, "gpu", where)
        if gpus > MAX_GPUS_PER_NODE:
            raise TraceError(f"{where}: field 'gpu' is {gpus}, at most {MAX_GPUS_PER_NODE} GPUs per node")
        code = (row.get("model") or "").strip()
        model = ""
        if gpus:
            if not code:
                raise TraceError(f"{where}: field 'model' is empty on a node with {gpus} GPUs")
            try:
                model = _model_name(code)
            except UnknownGpuModelError as exc:
                raise TraceError(f"{where}: field 'model': {exc}") from None
        nodes.append(NodeSpec(name, _int(row, "cpu_milli", where), _int(row, "memory_mib", where), gpus, model))
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return nodes


def load_pods(path: str | Path) -> list[PodDemand]:
    path = Path(path)
    pods = []
    for where, row in _rows(path, POD_COLUMNS):
        gpus = _int(row, "num_gpu", where)
        milli = _int(row, "gpu_milli", where)
        if gpus and not 0 < milli <= MILLI:
            raise TraceError(f"{where}: field 'gpu_milli' must be 1..1000 when num_gpu > 0, got {milli}")
        if gpus > 1 and milli < MILLI:
            raise TraceError(f"{where}: field 'gpu_milli' is {milli} with num_gpu={gpus}; shares are single-GPU")
        allowed = set()
        for code in (row.get("gpu_spec") or "").split("|"):
            if code.strip():
                try:
                    allowed.add(_model_name(code.strip()))
                except UnknownGpuModelError as exc:
                    raise TraceError(f"{where}: field 'gpu_spec': {exc}") from None
        pods.append(PodDemand(cpu_milli=_int(row, "cpu_milli", where), memory_mib=_int(row, "memory_mib", where),
                              gpus=gpus, gpu_milli=milli if gpus else 0, allowed_models=frozenset(allowed),
                              name=(row.get("name") or "").strip()))
    if not pods:
        raise TraceError(f"{path}: no pods")
    return pods
