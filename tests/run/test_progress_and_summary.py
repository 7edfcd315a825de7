"""What ``renderq run`` shows while it works and when it ends: progress, summary, notes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from renderq.backends.diffusers import DeviceTimer, free_cores
from renderq.cli.main import app
from renderq.cli.progress import ProgressBar, ProgressLines
from renderq.core.ledger import Ledger
from renderq.jobs.summary import Progress, RunSummary
from renderq.testing.fakes import ManualClock


def test_without_a_terminal_a_line_is_printed_every_few_seconds() -> None:
    clock, out = ManualClock(), io.StringIO()
    lines = ProgressLines(every_s=5.0, stream=out, clock=clock)
    p = Progress(40, accepted=3)
    for t in (1.0, 4.9, 5.0, 7.0, 10.5, 11.0):
        clock.t = t
        lines.update(p)
    printed = out.getvalue().splitlines()
    assert len(printed) == 2  # at 5.0 and at 10.5
    assert printed[0].startswith("renderq 3/40 done, ok 3 regen 0 esc 0")


def test_the_bar_keeps_its_width_on_an_80_column_terminal() -> None:
    from rich.console import Console

    screen = io.StringIO()
    console = Console(file=screen, width=80, force_terminal=True, color_system=None)
    with ProgressBar(console) as bar:
        bar.update(Progress(200, accepted=50, escalated=2))
    last = [x for x in screen.getvalue().replace("\r", "\n").splitlines() if "renderq" in x][-1]
    assert "52/200" in last and "ok 50" in last and "ETA" in last
    assert "━" in last
    # The bar keeps its 20 columns: the counters beside it do not squeeze it away.
    assert last.index("52/200") - last.index("renderq ") - len("renderq ") >= 20


def _summary(**kw: object) -> RunSummary:
    base: dict[str, object] = dict(
        mode="window", out="o", prompts=4, accepted=4, escalated=0, pending=0, submitted=0,
        batches=0, mean_batch_size=0.0, wall_s=0.1, runs=2, ledger=Ledger().report(),
    )  # fmt: skip
    base.update(kw)
    return RunSummary(**base)  # type: ignore[arg-type]


def test_a_low_cpu_share_is_called_inflated_and_a_full_one_is_not() -> None:
    note = _summary(cpu_share=0.31, threads=2).inflation_note()
    assert note is not None and "2 CPU thread(s) ran 31%" in note
    assert _summary(cpu_share=0.95, threads=1).inflation_note() is None
    assert _summary().inflation_note() is None


def test_the_device_timer_measures_the_cpu_share_of_its_work() -> None:
    timer = DeviceTimer("cpu")
    _, seconds = timer.measure(lambda: sum(i * i for i in range(2_000_000)))
    share = timer.cpu_share()
    assert seconds > 0 and share is not None and 0.0 < share <= 1.5


def test_free_cores_is_at_least_one_and_at_most_the_cores() -> None:
    import os

    assert 1 <= free_cores() <= len(os.sched_getaffinity(0))


@pytest.mark.slow
def test_a_resumed_run_says_it_had_nothing_left(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path
) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red circle\na blue square\n")
    args = [
        "run", str(prompts), "--out", str(tmp_path / "o"), "--model", str(tiny_model),
        "--scorer", str(tiny_clip), "--steps", "2", "--threshold", "-1", "--threads", "1",
    ]  # fmt: skip
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    assert "this run: 2 prompts submitted, mean batch size" in " ".join(first.stdout.split())
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    text = " ".join(again.stdout.split())
    assert "whole job (2 runs): accepted 2/2" in text
    assert "this run: nothing left to render" in text and "over 0 batches" not in text
    summary = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    assert summary["threads"] == 1 and summary["runs"] == 3
