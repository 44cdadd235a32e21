"""The scenarios, one module per family; ``ferrobench.cli.SCENARIOS`` names them."""
