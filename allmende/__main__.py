"""`python -m allmende`: the same command line as `allmende`."""

from allmende.cli.main import app

app(prog_name="allmende")
