"""The offline tools, each a subcommand in its own process: report, bisect, doctor, inspect."""
