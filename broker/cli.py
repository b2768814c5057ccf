"""The ``broker`` command line (Typer + Rich)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

app = typer.Typer(
    help="GPU broker: deadline- and budget-aware training jobs on spot and on-demand GPUs.",
    no_args_is_help=True,
)
db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")
local_app = typer.Typer(
    help="Clouds on this machine: moto (AWS) and a GCE fake.", no_args_is_help=True
)
app.add_typer(local_app, name="local")
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


@app.command()
def demo(
    scale: float = typer.Option(900.0, help="Simulated seconds per wall second."),
    data_dir: Path | None = typer.Option(None, help="Folder for the demo's database and logs."),
) -> None:
    """Run the whole broker locally on about twenty jobs and print what happened."""
    from broker.demo import run_demo

    wide = console if console.is_terminal else Console(width=160)
    if not run_demo(wide, scale=scale, data_dir=data_dir):
        raise typer.Exit(1)


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head", help="Target revision.")) -> None:
    """Migrate the configured database to the newest schema."""
    from broker.db import get_engine
    from broker.migrate import upgrade

    upgrade(get_engine(), revision)
    console.print(f"database at {revision}")


@local_app.command("up")
def local_up() -> None:
    """Start both local clouds with market replay; print their endpoints; Ctrl-C stops them."""
    import threading

    from broker.settings import get_settings
    from providers.local.stack import LocalCloud

    with LocalCloud.from_settings(get_settings()) as cloud:
        console.print("Local clouds running. Point the broker at them with:")
        for name, value in sorted(cloud.env.items()):
            console.print(f"  export {name}={value}")
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            console.print("stopping")


def _register_simulate() -> None:
    from broker.cli_simulate import simulate

    app.command("simulate", help="Replay spot traces: policy costs vs on-demand and optimal.")(
        simulate
    )


_register_simulate()


if __name__ == "__main__":
    app()
