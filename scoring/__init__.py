"""scoring: the pure decision core of gpuaas (cluster model, MIG geometry, packing policies, planner). No I/O."""
