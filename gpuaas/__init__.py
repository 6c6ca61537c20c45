"""gpuaas: the `gpuaas` command and its tools (demo, report, simulators, load generator, local KWOK cluster harness,
chart generator, config reference): the top layer, which the components never import."""
