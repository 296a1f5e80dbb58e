"""Simulated GPU nodes, the Python side of hack/fakegpu: machine profiles (`profiles`), the
simulated node a process attaches to and its fault-injection API (`simulator`), and
`vgpu-dra fakegpu` (`cli`).
"""
