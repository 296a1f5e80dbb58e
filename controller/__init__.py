"""The cluster-side process (`vgpu-dra controller`, a Deployment).

Holds only what runs in the cluster: today the entry point and its probes; the allocation
controller, admission webhook and rescheduler will live here. Node-scoped code (the ResourceSlice
publisher) belongs to `kubelet_plugin`. Imports `dra_driver`, never `kubelet_plugin`.
"""
