"""Pool specs shipped with gpuaas (`gpuaas cluster up --pools NAME`)."""
