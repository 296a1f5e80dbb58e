"""`vgpu-dra demo`: the end-to-end demo on a local cluster of simulated GPU nodes (docs/demo.md).

`cli` holds the step list, options and runner; `steps`, `caps` and `observe` the steps;
`workloads` the programs run inside a claim's container; `report` the pure tables the steps print.
"""
