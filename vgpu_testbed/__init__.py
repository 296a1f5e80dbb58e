"""Developer and test tooling: the local control plane and simulated GPU nodes.

Never imported by the production packages (dra_driver, kubelet_plugin, controller); it exists so
that `vgpu-dra dev-cluster`, `vgpu-dra fakegpu` and the tests share one implementation.
"""
