"""The local control plane: etcd, kube-apiserver, kube-scheduler and kube-controller-manager on
127.0.0.1, its directory, credentials, Node objects and health, and `vgpu-dra dev-cluster`.

`control_plane.Cluster` sequences a start and a stop; each other module is one step or one file
format of it (see docs/testbed.md for the list). Nothing here knows about GPUs beyond the
profile label a Node carries.
"""
