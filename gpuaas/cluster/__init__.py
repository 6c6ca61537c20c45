"""The local cluster harness: a real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)
with kwok playing GPU nodes built from a declarative pool spec."""
