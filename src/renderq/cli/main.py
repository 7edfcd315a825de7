"""renderq command line."""

import typer

app = typer.Typer(help="renderq: batched text-to-image rendering with a QA loop and a ledger.")


@app.command()
def version() -> None:
    """Print the renderq version."""
    from renderq import __version__

    typer.echo(__version__)
