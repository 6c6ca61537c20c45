"""The runtime layer the components (extender, autoscaler, node scaler) share: config loading, logging, the Kubernetes
client, informers, leader election, delegated authorization and node templates. It imports only `scoring` below it,
never a component or a tool (the contracts are in .importlinter)."""
