"""One module per contender of the sustained run (see ``benchmarks.sustained``)."""
