"""``python -m attnlab`` runs the command line (as the ``attnlab`` script does)."""

from attnlab.cli import app

app()
