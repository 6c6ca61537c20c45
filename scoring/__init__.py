"""scoring: the pure decision core of gpuaas (cluster model, MIG geometry, packing policies, planner). No I/O.

Modules:
  gpus           GPU catalog, MIG profiles and placements, MIG-manager named layouts, per-mask lookup tables
  model          NodeSpec / PodDemand and the column-wise ClusterState every decision reads
  kube           Kubernetes Node/Pod dicts -> model; the gpuaas.io/devices annotation
  fragmentation  FGD's typical pods and per-node fragmentation, cached and vectorised over nodes
  policies       Filter / Score / NormalizeScore / devices: random, first-fit, least-allocated, bestfit, fgd, gpuaas
  planner        CP-SAT: gang placement, MIG repartitioning, cheapest new nodes (time limits, greedy fallback, gap)
  simulation     the FGD evaluation protocol (shuffle, inflate to 130%, schedule one by one, curves)
"""
