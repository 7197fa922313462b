"""Thin wrapper: `python benchmarks/run.py ARGS` is `linattn bench ARGS` (see README.md here)."""

import sys

from linattn.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["bench", *sys.argv[1:]]))
