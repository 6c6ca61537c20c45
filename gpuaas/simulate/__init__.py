"""gpuaas simulate: offline what-if runs of the scoring core (packing now; autoscaling registers its own sub-verb)."""
