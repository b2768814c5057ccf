"""``python -m broker.cli``: the same commands as the ``broker`` script."""

from broker.cli.app import app

app()
