"""gpuaas: command line, local KWOK cluster harness and shared plumbing."""
