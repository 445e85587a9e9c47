"""Which components run in which process: declared here, apart from HTTP (see the README)."""
