"""One module per check, table or figure of the spec, plus benchmarks; each is a `linattn` command."""
