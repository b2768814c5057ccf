"""The ``broker`` command line (Typer + Rich): one module per command group."""

from broker.cli.app import app

__all__ = ["app"]
