"""Real test-bed nodes: the real kubelet, containerd (CDI) and runc run the pods.

The counterpart of the kubelet stand-in (`vgpu_testbed.standin.node_agents`); see docs/testbed.md
("Real nodes") for the anatomy of a node and how to debug a pod there. Entry point:
`vgpu_testbed.realnode.node.start_real_nodes`.
"""
