"""Command-line subcommands that own their arguments (registered in ``streameval.cli.COMMANDS``)."""
