"""extender: the kube-scheduler HTTP extender."""
