"""Every command's help: a flag that takes no value shows none."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from renderq.cli.main import app

COMMANDS = sorted(c.name or c.callback.__name__ for c in app.registered_commands if c.callback)


def test_every_command_is_covered() -> None:
    assert {"run", "simulate", "bench", "profile", "serve", "calibrate", "review"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_flags_show_no_value_in_help(command: str) -> None:
    # A flag shown as ``--json <bool>`` invites ``--json=true``, which it refuses: a flag
    # (or a --x/--no-x pair) shows no value. Typer's own --help is left as it draws it.
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    shown = [line for line in result.output.splitlines() if "<bool>" in line]
    assert all("--help" in line for line in shown), shown


def test_a_flag_given_a_value_is_refused_by_name() -> None:
    result = CliRunner().invoke(app, ["bench", "--json=true"], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert "--json" in result.output and "does not take a value" in result.output
