"""Prometheus metrics of the node scaler, on a registry of its own."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.decisions = Counter("gpuaas_nodescaler_decisions_total",
                                 "Decisions, by kind (scale_up, mig_repartition, drain_start, evict, node_delete, "
                                 "drain_rollback, provision_failed, wait_upcoming, not_triggered) and outcome",
                                 ["kind", "outcome"], registry=r)
        self.nodes_added = Counter("gpuaas_nodescaler_nodes_added_total", "Nodes asked for, by group", ["group"],
                                   registry=r)
        self.nodes_removed = Counter("gpuaas_nodescaler_nodes_removed_total", "Nodes deleted, by group and reason",
                                     ["group", "reason"], registry=r)
        self.reconcile = Histogram("gpuaas_nodescaler_reconcile_duration_seconds", "One run_once, snapshot to last "
                                   "action", buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30), registry=r)
        self.scale_up_latency = Histogram("gpuaas_nodescaler_scale_up_latency_seconds",
                                          "From the oldest pod of a scale-up turning unschedulable to the grow request",
                                          buckets=(0.25, 0.5, 1, 2, 5, 10, 30, 60), registry=r)
        self.pending = Gauge("gpuaas_nodescaler_unschedulable_gpu_pods", "Unschedulable GPU pods seen", registry=r)
        self.group_size = Gauge("gpuaas_nodescaler_group_nodes", "Nodes per group and state (ready, booting, "
                                "unready: in service but not GPU-ready, draining)",
                                ["group", "state"], registry=r)
        self.backoff = Gauge("gpuaas_nodescaler_group_backed_off", "1 while a group is backed off", ["group"],
                             registry=r)
        self.leader = Gauge("gpuaas_nodescaler_leader", "1 while this replica holds the lease", registry=r)
        self.errors = Counter("gpuaas_nodescaler_errors_total", "Failed API or provider calls, by operation",
                              ["op"], registry=r)
