"""A simulated node without a kubelet: the node agents (simulated GPUs, our kubelet plugin, the
kubelet stand-in) and the stand-in itself, which drives the plugin over the kubelet's real gRPC
protocols. The real-kubelet counterpart is `vgpu_testbed.realnode`.
"""
