"""`python -m swarmnode.node.cli ...`: the `swarmnode` command."""

from swarmnode.node.cli.main import main

main()
