"""A/B on real runs: device-seconds per accepted image, ``--mode adhoc`` vs ``--mode window``.

Each mode is one ``renderq run`` process on the same prompts, into a fresh output folder,
with the QA loop on (scoring and regenerations are booked too). The figure compared is
the ledger's total device-seconds divided by the images accepted. ``adhoc`` renders and
scores one image at a time (the baseline); ``window`` fills batches up to
``--max-batch-size`` and lets regenerations ride with first attempts. On a CPU the render
and score stages share the cores, so each batch's measured seconds include that sharing.

Run: ``python benchmarks/ab_run.py [--prompts FILE] [--model ID --scorer ID] [--tiny]``.
``--tiny`` builds the tiny seeded test checkpoints and uses them instead of the embedded
models. Any extra ``renderq run`` option can follow ``--``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_EXAMPLE = Path(__file__).resolve().parents[1] / "src" / "renderq" / "examples" / "shapes-200.txt"
_CLI = "from renderq.cli.main import app; app()"


def run_mode(mode: str, args: argparse.Namespace, out: Path, extra: list[str]) -> dict[str, Any]:
    """One ``renderq run`` in ``mode``; returns its ``--json`` summary."""
    cmd = [
        sys.executable, "-c", _CLI, "run", str(args.prompts), "--out", str(out),
        "--mode", mode, "--model", args.model, "--scorer", args.scorer,
        "--max-attempts", str(args.max_attempts), "--max-batch-size", str(args.max_batch_size),
        "--threads", str(args.threads), "--json", *extra,
    ]  # fmt: skip
    for flag, value in (("--steps", args.steps), ("--threshold", args.threshold)):
        if value is not None:  # else the model's own default, as renderq run chooses
            cmd += [flag, str(value)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
    if done.returncode != 0:
        sys.exit(f"renderq run --mode {mode} failed:\n{done.stderr[-4000:]}")
    summary: dict[str, Any] = json.loads(done.stdout)
    return summary


def _tiny(folder: Path) -> tuple[str, str]:
    from renderq.backends.diffusers import quiet_libraries
    from renderq.testing.tiny import build_tiny_clip, build_tiny_pipeline

    quiet_libraries()
    model = build_tiny_pipeline(folder / "tiny-sd", sample_size=16)
    clip = build_tiny_clip(folder / "tiny-clip")
    return str(model), str(clip)


def _or_default(value: object) -> str:
    return "default" if value is None else str(value)


def _row(mode: str, s: dict[str, Any]) -> str:
    per = s["device_seconds_per_accepted"]
    secs = s["device_seconds"]
    return (
        f"{mode:<7} {s['accepted']:>4}/{s['prompts']:<4} {s['escalated']:>4} "
        f"{s['mean_batch_size']:>6.2f} {secs['render'] + secs['regen']:>9.2f} "
        f"{secs['score'] + secs['rescore']:>8.2f} {secs['total']:>9.2f} "
        f"{'-' if per is None else f'{per:.4f}':>10} {s['wall_s']:>7.1f}"
    )


def main(argv: list[str] | None = None) -> None:
    """Parse arguments, run both modes, print the comparison."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--prompts", type=Path, default=_EXAMPLE)
    p.add_argument("--model", default="embedded:mini-sd")
    p.add_argument("--scorer", default="embedded:clip")
    p.add_argument("--tiny", action="store_true", help="use tiny seeded test checkpoints")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--threshold", type=float, default=None)
    p.add_argument("--max-attempts", type=int, default=3)
    p.add_argument("--max-batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--modes", default="adhoc,window")
    p.add_argument("--json", action="store_true", help="print the summaries as JSON too")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="renderq-ab-") as tmp:
        if args.tiny:
            args.model, args.scorer = _tiny(Path(tmp))
        results = {m: run_mode(m, args, Path(tmp) / m, extra) for m in args.modes.split(",")}
    print(f"prompts: {args.prompts.name}, model: {Path(args.model).name}, "
          f"steps {_or_default(args.steps)}, threshold {_or_default(args.threshold)}, "
          f"max attempts {args.max_attempts}, "
          f"max batch {args.max_batch_size}")  # fmt: skip
    print("mode    accepted  esc  mean-b  render-s  score-s   total-s  s/accepted  wall-s")
    for mode, s in results.items():
        print(_row(mode, s))
    per = {m: s["device_seconds_per_accepted"] for m, s in results.items()}
    if per.get("adhoc") and per.get("window"):
        print(f"window uses {per['window'] / per['adhoc']:.1%} of adhoc's device-seconds "
              "per accepted image")  # fmt: skip
    if args.json:
        print(json.dumps(results, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
