"""The kube-scheduler extender wire format (k8s.io/kube-scheduler/extender/v1/types.go), as pydantic models.

The Go structs have no json tags, so keys are the Go field names (PascalCase), and a nil pointer or map travels as
JSON `null`. Embedded Kubernetes objects (Pod, NodeList) keep their own camelCase keys; they are kept as plain dicts
here and turned into the scoring model by `scoring`'s parser, the one place that reads Kubernetes objects.
"""
from __future__ import annotations

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
    MAX_RECORD_BYTES the entries are joined one by one instead."""

    MAX_RECORD_BYTES = 160
    _SUFFIX = np.array([f"{s}}}".encode() for s in range(MAX_EXTENDER_PRIORITY + 1)], dtype=object)

    def __init__(self) -> None:
        self._row_names: list[str] | None = None
        self._entries = np.empty(0, dtype=object)  # [row, score]: b'{"Host":"NAME","Score":S}'
        self._records: np.ndarray | None = None  # [row, score]: the entry, spaces, "," (fixed width)

    @staticmethod
    def _head(name: str) -> bytes:
        return b'{"Host":' + orjson.dumps(name) + b',"Score":'

    def _new_node_set(self, row_names: list[str]) -> None:
        heads = np.array([self._head(n) for n in row_names], dtype=object)
        self._entries = heads[:, None] + self._SUFFIX[None, :]
        width = max((len(e) for e in self._entries.ravel()), default=0) + 1
        self._records = None
        if 0 < width <= self.MAX_RECORD_BYTES:
            self._records = np.array([e.ljust(width - 1) + b"," for e in self._entries.ravel()],
                                     dtype=f"S{width}").reshape(self._entries.shape)
        self._row_names = row_names

    def encode(self, names: list[str], rows: np.ndarray, scores: np.ndarray, row_names: list[str]) -> bytes:
        """`scores[i]` (0..10) for `names[i]`, whose model row is `rows[i]` (-1: unknown) in `row_names`."""
        if row_names is not self._row_names:  # a new node set: the model was rebuilt
            self._new_node_set(row_names)
        if len(scores) and (scores.min() < 0 or scores.max() > MAX_EXTENDER_PRIORITY):
            raise ValueError(f"scores must be within 0..{MAX_EXTENDER_PRIORITY}")
        if not len(scores):
            return b"[]"
        unknown = rows < 0
        if self._records is not None and not unknown.any():
            records: np.ndarray = self._records[rows, scores]
            return b"[" + records.tobytes()[:-1] + b"]"  # [:-1]: the last record's ","
        entries = self._entries[np.where(unknown, 0, rows), scores].tolist()
        for i in np.flatnonzero(unknown).tolist():  # names gpuaas does not know (few): encoded here
            entries[i] = self._head(names[i]) + self._SUFFIX[scores[i]]
        return b"[" + b",".join(entries) + b"]"


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
