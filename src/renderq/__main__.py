"""``python -m renderq`` runs the command line."""

from renderq.cli.main import app

app()
