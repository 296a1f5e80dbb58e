"""Developer and test tooling: the local control plane and simulated GPU nodes.

The product packages (dra_driver, kubelet_plugin, controller) never import it, with one guarded
exception: the `vgpu-dra` console script loads the test-bed subcommands (`dev-cluster`,
`fakegpu`, `demo`) through `dra_driver.cli._load_testbed`, which names the `testbed` extra when
it is not installed. It exists so that those commands and the tests share one implementation.
"""
