"""The ``broker`` command line (Typer + Rich)."""

from __future__ import annotations

import typer
from rich.console import Console

app = typer.Typer(
    help="GPU broker: deadline- and budget-aware training jobs on spot and on-demand GPUs.",
    no_args_is_help=True,
)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")
console = Console()


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8000, help="Port to listen on."),
) -> None:
    """Run the API on the embedded default (SQLite in ./.broker unless BROKER_DATABASE_URL)."""
    import uvicorn

    from broker.embedded import prepare

    token, generated = prepare()
    if generated:
        console.print(
            f"[bold]Admin token[/bold] (shown once, kept in .broker/admin_token): {token}"
        )
    console.print(f"API on http://{host}:{port}  (docs: http://{host}:{port}/docs)")
    from broker.api import create_app

    uvicorn.run(create_app(), host=host, port=port, log_level="info")


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head", help="Target revision.")) -> None:
    """Migrate the configured database to the newest schema."""
    from broker.db import get_engine
    from broker.migrate import upgrade

    upgrade(get_engine(), revision)
    console.print(f"database at {revision}")


if __name__ == "__main__":
    app()
