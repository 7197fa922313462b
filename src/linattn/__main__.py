"""`python -m linattn` is the `linattn` command."""

from linattn.cli import main

raise SystemExit(main())
