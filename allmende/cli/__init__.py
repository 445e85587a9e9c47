"""The command line: the top of the call chain, imported by nothing."""
