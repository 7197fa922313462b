"""One module per check, table or figure of the spec, plus benchmarks; each a `linattn` command."""
