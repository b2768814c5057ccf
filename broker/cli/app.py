"""The ``broker`` command line (Typer + Rich)."""

from __future__ import annotations

import contextlib
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
    port: int = typer.Option(8000, help="Port of the API on 127.0.0.1."),
    scale: float = typer.Option(60.0, help="Simulated seconds per wall second (1: real time)."),
) -> None:
    """The whole broker on this machine, on local clouds, for trying it by hand.

    API, Celery worker and beat, moto and the GCE fake with replayed spot markets, and
    instances that run the agent and the jobs' programs, all on the embedded default (SQLite
    and files in ./.broker).
    """
    import signal
    import threading

    from broker.devstack.embedded import ensure_admin_token, scaled_epoch
    from broker.devstack.stack import EmbeddedStack
    from broker.settings import get_settings

    settings = get_settings()
    token, generated = ensure_admin_token(settings)
    stack = EmbeddedStack(
        settings.data_dir,
        scale=scale,
        database_url=settings.database_url,
        celery_broker_url=settings.celery_broker_url,
        admin_token=token,
        agent_secret=settings.agent_secret.get_secret_value() if settings.agent_secret else None,
        api_port=port,
        epoch=scaled_epoch(settings, scale),
        tick_seconds=max(min(settings.tick_seconds, 3600 / scale), 1.0),
    )
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    with stack:
        if generated:
            console.print(f"[bold]Admin token[/bold] (kept in .broker/admin_token): {token}")
        console.print(f"API on {stack.api_url}  (docs: {stack.api_url}/docs); clock x{scale:g}")
        console.print(f"logs: {stack.data_dir}/api.log, {stack.data_dir}/worker.log; Ctrl-C stops")
        with contextlib.suppress(KeyboardInterrupt):
            stopped.wait()
        console.print("stopping")


@app.command()
def demo(
    scale: float = typer.Option(300.0, help="Simulated seconds per wall second."),
    data_dir: Path | None = typer.Option(None, help="Folder for the demo's database and logs."),
    stay: bool | None = typer.Option(
        None, help="Keep the dashboard up after the summary (default: in a terminal)."
    ),
) -> None:
    """Run the whole broker locally on about twenty jobs and print what happened."""
    from broker.devstack.demo import run_demo

    wide = console if console.is_terminal else Console(width=160)
    keep = console.is_terminal if stay is None else stay
    if not run_demo(wide, scale=scale, data_dir=data_dir, stay=keep):
        raise typer.Exit(1)


@db_app.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head", help="Target revision.")) -> None:
    """Migrate the configured database to the newest schema."""
    from broker.db.engine import get_engine
    from broker.db.migrate import upgrade

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
    from broker.cli.simulate import simulate

    app.command("simulate", help="Replay spot traces: policy costs vs on-demand and optimal.")(
        simulate
    )


_register_simulate()


def _register_client() -> None:
    from broker.cli.admin import admin_app
    from broker.cli.jobs import jobs_app
    from broker.cli.prices import prices
    from broker.cli.quote import quote
    from broker.cli.spend import spend

    app.add_typer(admin_app, name="admin")
    app.add_typer(jobs_app, name="jobs")
    app.command("quote")(quote)
    app.command("prices")(prices)
    app.command("spend")(spend)


_register_client()


def _register_doctor() -> None:
    from broker.cli.doctor import doctor

    app.command("doctor")(doctor)


_register_doctor()


if __name__ == "__main__":
    app()
