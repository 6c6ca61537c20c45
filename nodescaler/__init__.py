"""The node scaler (`gpuaas nodescaler`): grow node groups for unschedulable GPU pods (repartitioning idle MIG GPUs
first), drain and remove idle GPU nodes without breaking PodDisruptionBudgets, one leader at a time.

- config.py     node groups (a runtime/pools.py pool as template), scale-out, scale-in, leader election
- snapshot.py   Nodes, Pods, PDBs -> frozen records + the scoring model (pure)
- scaleout.py   what to grow / repartition for pending pods (pure; scoring.planner)
- scalein.py    which nodes to drain: one small type per disruption method (pure)
- drain.py      the drain state machine recorded on the node (pure steps + patches)
- provider.py   Provider protocol, KWOK provider, per-group dispatch, fake
- karpenter.py  Karpenter provider: standalone NodeClaims (Karpenter launches, gpuaas drains then deletes)
- controller.py decide (pure) + NodeScaler.run_once(now) over a thin Kubernetes shell
- service.py    the process: informers, leader election, /metrics, the loop
"""
