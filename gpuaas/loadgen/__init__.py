"""Load for the autoscaler: request-arrival traces, a model of LLM inference replicas serving them, and a replayer
that drives that model in real time against the pods of a Deployment and exports vLLM-style metrics per pod."""
