"""`python -m importwatch`: the command line."""

from importwatch.cli import main

raise SystemExit(main())
