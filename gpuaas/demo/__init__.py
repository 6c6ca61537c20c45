"""`gpuaas demo`: the platform end to end on local KWOK clusters (cli.py), what it submits (timeline.py), one cluster
with its components (stack.py), and what it records (sampling.py)."""
