"""The kube-scheduler extender wire format (k8s.io/kube-scheduler/extender/v1/types.go), as pydantic models.

The Go structs have no json tags, so keys are the Go field names (PascalCase), and a nil pointer or map travels as
JSON `null`. Embedded Kubernetes objects (Pod, NodeList) keep their own camelCase keys; they are kept as plain dicts
here and turned into the scoring model by `scoring`'s parser, the one place that reads Kubernetes objects.
"""
from __future__ import annotations

from itertools import compress, repeat
from typing import Any

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from scoring.names import dns1123_label, dns1123_subdomain
from scoring.policies import MAX_EXTENDER_PRIORITY


class _Wire(BaseModel):
    # Unknown keys are ignored: a newer kube-scheduler may send fields this version does not know.
    model_config = ConfigDict(extra="ignore")


class ExtenderArgs(_Wire):
    """Request of the filter and prioritize verbs."""

    Pod: dict[str, Any]
    Nodes: dict[str, Any] | None = None  # a v1.NodeList; sent only when nodeCacheCapable is false
    NodeNames: list[str] | None = None  # sent only when nodeCacheCapable is true

    @field_validator("Pod")
    @classmethod
    def _pod_has_identity(cls, pod: dict[str, Any]) -> dict[str, Any]:
        meta = pod.get("metadata")
        if not isinstance(meta, dict) or not meta.get("name"):
            raise ValueError("Pod.metadata.name is required")
        dns1123_subdomain(meta["name"], "Pod.metadata.name")
        if "namespace" in meta:
            dns1123_label(meta["namespace"], "Pod.metadata.namespace")
        if not isinstance(pod.get("spec"), dict):
            raise ValueError("Pod.spec is required")
        return pod

    @field_validator("Nodes")
    @classmethod
    def _nodes_have_names(cls, nodes: dict[str, Any] | None) -> dict[str, Any] | None:
        if nodes is None:
            return None
        items = nodes.get("items")
        if items is None:
            return nodes
        if not isinstance(items, list):
            raise ValueError(f"Nodes.items must be a list, got {type(items).__name__}")
        for i, n in enumerate(items):
            meta = n.get("metadata") if isinstance(n, dict) else None
            if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
                raise ValueError(f"Nodes.items[{i}].metadata.name is required (a string)")
        return nodes

    def node_names(self) -> list[str]:
        """The candidate nodes, from NodeNames or, without a node cache, from the NodeList's items; each once, in the
        order first given (a name sent twice is answered once)."""
        if self.NodeNames is not None:
            return list(dict.fromkeys(self.NodeNames))
        if self.Nodes is not None:
            return list(dict.fromkeys(n["metadata"]["name"] for n in self.Nodes.get("items") or ()))
        return []


class ExtenderFilterResult(_Wire):
    Nodes: dict[str, Any] | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] | None = None
    FailedAndUnresolvableNodes: dict[str, str] | None = None
    Error: str = ""


class HostPriority(_Wire):
    """One entry of the prioritize reply, a JSON array of these (the server writes it directly: it can hold
    thousands)."""

    Host: str
    Score: int = Field(ge=0, le=MAX_EXTENDER_PRIORITY)


class HostPriorityEncoder:
    """Writes the prioritize reply, a JSON array of HostPriority, for thousands of candidates without a dict per
    entry. Every node's entry for every score, `{"Host":"NAME","Score":S},`, is encoded once per node set into a
    fixed-width record padded with spaces (JSON allows whitespace between tokens): a reply is then one numpy gather
    of records and one copy (0.16 ms for 3,500 candidates inside the server, against 0.3 ms joining one bytes
    object per entry). Node sets with very uneven name lengths would pad every record to the longest: past
    MAX_RECORD_BYTES the entries are joined one by one instead. A node added or removed (the model's rows after it
    renumbered, scoring.clusterview) moves the records of the names known to their new rows and encodes only the new
    names: the records are those a new encoder would make for the new node set.

    Entries scoring 0 are left out when another scores above 0. kube-scheduler decodes every entry, builds a score
    entry per host and adds score x weight x 10 to that host's total (prioritizeNodes, pkg/scheduler/schedule_one.go,
    v1.36.3); a host missing from the list gets nothing added, the same total as a 0. What differs is its tie-breaker:
    kube-scheduler draws a random one only for hosts an extender listed (kubernetes/kubernetes#141024), so a host left
    out loses a tie of totals against a listed one and ties among hosts left out go by position. That touches a
    decision only when a host gpuaas scored 0 reaches the top total, more than 10 x weight points above gpuaas's pick
    (500 at the shipped weight 5) on kube-scheduler's own scores alone; when every score is 0 (nothing fits, or
    nothing is preferred) every entry is sent, so that kube-scheduler's random tie-break stays."""

    MAX_RECORD_BYTES = 160
    _SUFFIX = np.array([f"{s}}}".encode() for s in range(MAX_EXTENDER_PRIORITY + 1)], dtype=object)

    def __init__(self) -> None:
        self._row_names: list[str] | None = None
        self._row_of: dict[str, int] = {}  # name -> its row in _heads and _records
        self._heads = np.empty(0, dtype=object)  # per row: b'{"Host":"NAME","Score":', an entry without its score
        self._head_len = np.empty(0, dtype=np.int64)  # per row: len of its head
        self._records: np.ndarray | None = None  # [row, score]: the entry, spaces, "," (fixed width)

    @staticmethod
    def _head(name: str) -> bytes:
        return b'{"Host":' + orjson.dumps(name) + b',"Score":'

    def _width(self, head_len: np.ndarray) -> int:
        """The record width for entries with these head lengths (the longest entry, a score of 10, and its ",")."""
        return int(head_len.max()) + len(self._SUFFIX[-1]) + 1 if head_len.size else 0

    def _new_node_set(self, row_names: list[str]) -> None:
        old = np.fromiter(map(self._row_of.get, row_names, repeat(-1)), dtype=np.int64, count=len(row_names))
        fresh = np.flatnonzero(old < 0)
        self._row_of = dict(zip(row_names, range(len(row_names)), strict=True))
        self._row_names = row_names
        if self._records is not None and len(row_names) and len(fresh) <= len(row_names) // 2:
            added = [self._head(row_names[i]) for i in fresh.tolist()]
            head_len = self._head_len[old]
            head_len[fresh] = [len(h) for h in added]
            width = self._width(head_len)
            if width <= self.MAX_RECORD_BYTES:  # the records a new encoder would make: moved, new ones added
                heads, records = self._heads[old], _padded(self._records[old], width)
                for i, head in zip(fresh.tolist(), added, strict=True):
                    heads[i] = head
                    records[i] = [(head + suffix).ljust(width - 1) + b"," for suffix in self._SUFFIX]
                self._heads, self._records, self._head_len = heads, records, head_len
                return
        self._heads = np.array([self._head(n) for n in row_names], dtype=object)
        self._head_len = np.array([len(h) for h in self._heads], dtype=np.int64)
        width = self._width(self._head_len)
        self._records = None
        if 0 < width <= self.MAX_RECORD_BYTES:
            entries = self._heads[:, None] + self._SUFFIX[None, :]
            self._records = np.array([e.ljust(width - 1) + b"," for e in entries.ravel()],
                                     dtype=f"S{width}").reshape(entries.shape)

    def encode(self, names: list[str], rows: np.ndarray, scores: np.ndarray, row_names: list[str]) -> bytes:
        """`scores[i]` (0..10) for `names[i]`, whose model row is `rows[i]` (-1: unknown) in `row_names`."""
        if row_names is not self._row_names:  # a new node set: a node added or removed, or the model rebuilt
            self._new_node_set(row_names)
        if len(scores) and (scores.min() < 0 or scores.max() > MAX_EXTENDER_PRIORITY):
            raise ValueError(f"scores must be within 0..{MAX_EXTENDER_PRIORITY}")
        if not len(scores):
            return b"[]"
        listed = scores > 0
        if listed.any() and not listed.all():  # (see the class docstring)
            keep = np.flatnonzero(listed)
            if (rows < 0).any():
                names = list(compress(names, listed.tolist()))
            rows, scores = rows[keep], scores[keep]
        unknown = rows < 0
        if self._records is not None and not unknown.any():
            records: np.ndarray = self._records[rows, scores]
            return b"[" + records.tobytes()[:-1] + b"]"  # [:-1]: the last record's ","
        entries = (self._heads[np.where(unknown, 0, rows)] + self._SUFFIX[scores]).tolist()
        for i in np.flatnonzero(unknown).tolist():  # names gpuaas does not know (few): encoded here
            entries[i] = self._head(names[i]) + self._SUFFIX[scores[i]]
        return b"[" + b",".join(entries) + b"]"


def _padded(records: np.ndarray, width: int) -> np.ndarray:
    """Fixed-width records (an entry, spaces, ",") padded or cut to `width` bytes, every entry fitting: array work
    over their bytes, the "," moved to the new end."""
    if records.dtype.itemsize == width:
        return records
    src = records.view(np.uint8).reshape(-1, records.dtype.itemsize)
    out = np.full((len(src), width), ord(" "), dtype=np.uint8)
    keep = min(records.dtype.itemsize, width) - 1
    out[:, :keep] = src[:, :keep]
    out[:, -1] = ord(",")
    padded: np.ndarray = out.view(f"S{width}").reshape(records.shape)
    return padded


class ExtenderBindingArgs(_Wire):
    """Names checked as the apiserver checks them (scoring.names) before they reach a URL or the model."""

    PodName: str = Field(min_length=1)
    PodNamespace: str = Field(min_length=1)
    PodUID: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    Node: str = Field(min_length=1)

    @field_validator("PodName", "Node")
    @classmethod
    def _subdomain(cls, name: str) -> str:
        return dns1123_subdomain(name)  # pydantic's error names the field

    @field_validator("PodNamespace")
    @classmethod
    def _label(cls, namespace: str) -> str:
        return dns1123_label(namespace)


class ExtenderBindingResult(_Wire):
    Error: str = ""
