"""renderq command line: one typer app; each command lives in its own module."""

from __future__ import annotations

import typer

from renderq.cli.bench import bench_command
from renderq.cli.calibrate import calibrate
from renderq.cli.profile import profile_command
from renderq.cli.review import review_command
from renderq.cli.run import run as run_command
from renderq.cli.serve import serve_command
from renderq.cli.simulate import simulate_command

app = typer.Typer(
    help="renderq: batched text-to-image rendering with a QA loop and a device-cost ledger.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.command()
def version() -> None:
    """Print the renderq version."""
    from renderq import __version__

    typer.echo(__version__)


app.command("simulate")(simulate_command)
app.command("run")(run_command)
app.command("calibrate")(calibrate)
app.command("profile")(profile_command)
app.command("bench")(bench_command)
app.command("serve")(serve_command)
app.command("review")(review_command)
