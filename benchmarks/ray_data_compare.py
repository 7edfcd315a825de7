"""renderq on Ray against Ray Data ``map_batches``: one offline job, the same model, in one run.

What a user would otherwise write for an offline job on Ray is a Ray Data pipeline: the
prompts as a dataset, ``map_batches`` with a pool of actors that each hold the pipeline
and the scorer, render a batch and score it. Ray Data has no QA loop, so the failures go
through a second pass (and a third: as many as renderq's attempts), each with the next
seed of the same deterministic schedule (``renderq.core.seeds.seed_for``).

Both sides run the embedded mini-SD and CLIP with renderq's own executor and scorer (the
same images for the same seeds), two one-thread CPU actors on a local Ray of two CPUs,
batches of ``--batch``, the scorer's shipped threshold and ``--max-attempts``:

- **renderq**: ``renderq run PROMPTS --backend ray --devices cpu:1,cpu:1 --mode window``
  (render actors; the scheduler and the scorer in the driver, regenerations joining the
  next batches);
- **Ray Data**: ``map_batches(RenderScore, concurrency=2, num_cpus=1, batch_size=...)``,
  render and score in the same actor, one pass per attempt over the prompts still
  failing.

Each side runs as its own process, timed from start to exit (Ray's start, model loads and
every pass included), ``--rounds`` times alternating which goes first. Printed per run:
wall seconds, device-seconds (render and score, as each side measured them inside its
actors or workers), accepted and escalated prompts, device-seconds per accepted image,
and whether both accepted the same (prompt, seed) set.

Run: ``python benchmarks/ray_data_compare.py [--prompts 48] [--batch 8] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODEL, SCORER = "embedded:mini-sd", "embedded:clip"
EXAMPLES = Path(__file__).resolve().parents[1] / "src" / "renderq" / "examples" / "shapes-200.txt"


class RenderScore:
    """A Ray Data actor: renderq's executor and scorer loaded once, render then score."""

    def __init__(self, threshold: float) -> None:
        from renderq.backends.clip import ClipScorer
        from renderq.backends.diffusers import DiffusersExecutor, set_cpu_threads
        from renderq.backends.registry import model_defaults, resolve
        from renderq.core.settings import key_for

        set_cpu_threads(1)
        self.ex = DiffusersExecutor.load(resolve(MODEL), name=MODEL)
        self.scorer = ClipScorer.load(resolve(SCORER), name=SCORER)
        steps, self.guidance = model_defaults(MODEL)
        w, h = self.ex.default_size()
        self.key = key_for(MODEL, w, h, steps, self.guidance, self.ex.sampler, "fp32", "cpu")
        self.threshold = threshold

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        from renderq.core.types import Batch, Request

        rows = zip(batch["id"], batch["prompt"], batch["base"], batch["attempt"], strict=True)
        reqs = tuple(
            Request(str(i), str(p), self.key, int(b), attempt=int(a), guidance_scale=self.guidance)
            for i, p, b, a in rows
        )
        rendered = self.ex.run(Batch(0, self.key, reqs, 0.0, len(reqs)))
        images = [it.image for it in rendered.items]
        scored = self.scorer.score(images, [r.prompt for r in reqs])
        n = len(reqs)
        return {
            "id": batch["id"],
            "score": np.array([s if s is not None else -1.0 for s in scored.scores]),
            "render_s": np.full(n, rendered.device_seconds / n),
            "score_s": np.full(n, scored.device_seconds / n),
        }


def ray_data_job(prompts: list[str], seed: int, batch: int, attempts: int) -> dict[str, Any]:
    """The Ray Data side, in this process: one ``map_batches`` pass per attempt."""
    import ray

    from renderq.backends.registry import scorer_default_threshold
    from renderq.core.seeds import seed_for

    threshold = scorer_default_threshold(SCORER)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    todo = [{"id": f"p{i:06d}", "prompt": p, "base": seed + i} for i, p in enumerate(prompts)]
    accepted: dict[str, int] = {}
    render_s = score_s = 0.0
    passes = 0
    for attempt in range(attempts):
        if not todo:
            break
        passes += 1
        items = [{**t, "attempt": attempt} for t in todo]
        ds = ray.data.from_items(items).map_batches(
            RenderScore, fn_constructor_kwargs={"threshold": threshold}, batch_size=batch,
            concurrency=2, num_cpus=1, batch_format="numpy",
        )  # fmt: skip
        rows = {str(r["id"]): r for r in ds.take_all()}
        render_s += sum(float(r["render_s"]) for r in rows.values())
        score_s += sum(float(r["score_s"]) for r in rows.values())
        failing = []
        for t in todo:
            if float(rows[t["id"]]["score"]) >= threshold:
                accepted[t["id"]] = seed_for(int(t["base"]), attempt)
            else:
                failing.append(t)
        todo = failing
    ray.shutdown()
    return {
        "accepted": sorted(accepted.items()),
        "escalated": len(todo),
        "render_s": render_s,
        "score_s": score_s,
        "passes": passes,
    }


def renderq_job(prompts_file: Path, out: Path, batch: int, attempts: int) -> dict[str, Any]:
    """The renderq side: ``renderq run`` on Ray actors; returns its summary and accepted set."""
    exe = Path(sys.executable).with_name("renderq")
    cmd = [str(exe), "run", str(prompts_file), "--out", str(out), "--backend", "ray",
           "--devices", "cpu:1,cpu:1", "--mode", "window", "--max-batch-size", str(batch),
           "--max-attempts", str(attempts), "--threads", "1", "--json"]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"renderq run failed:\n{res.stdout}\n{res.stderr}")
    summary = json.loads(res.stdout[res.stdout.index("{") :])
    meta = [json.loads(x) for x in (out / "metadata.jsonl").read_text().splitlines()]
    seconds = summary["device_seconds"]
    return {
        "accepted": sorted((m["id"], int(m["seed"])) for m in meta),
        "escalated": summary["escalated"],
        "render_s": seconds.get("render", 0.0) + seconds.get("regen", 0.0),
        "score_s": seconds.get("score", 0.0) + seconds.get("rescore", 0.0),
        "batches": summary["batches_this_run"],
    }


def timed(cmd: list[str]) -> tuple[float, dict[str, Any]]:
    """Run one side as its own process; its wall seconds and the JSON it printed last."""
    start = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if res.returncode != 0:
        raise SystemExit(f"{cmd} failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return wall, json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    """Alternate the two sides for ``--rounds`` and print the table (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-attempts", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--side", choices=("renderq", "ray-data"), help=argparse.SUPPRESS)
    ap.add_argument("--prompts-file", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side == "renderq":
        print(json.dumps(renderq_job(args.prompts_file, args.out, args.batch, args.max_attempts)))
        return
    if args.side == "ray-data":
        prompts = args.prompts_file.read_text().splitlines()
        print(json.dumps(ray_data_job(prompts, args.seed, args.batch, args.max_attempts)))
        return
    lines = [x for x in EXAMPLES.read_text().splitlines() if x.strip()][: args.prompts]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        prompts_file = Path(tmp) / "prompts.txt"
        prompts_file.write_text("\n".join(lines) + "\n")
        base = [sys.executable, __file__, "--batch", str(args.batch), "--max-attempts",
                str(args.max_attempts), "--seed", str(args.seed), "--prompts-file",
                str(prompts_file)]  # fmt: skip
        for r in range(args.rounds):
            order = ("renderq", "ray-data") if r % 2 == 0 else ("ray-data", "renderq")
            for side in order:
                out = Path(tmp) / f"out-{r}-{side}"
                wall, res = timed([*base, "--side", side, "--out", str(out)])
                device = res["render_s"] + res["score_s"]
                n = len(res["accepted"])
                rows.append({"round": r, "system": side, "wall_s": wall, "device_s": device,
                             "render_s": res["render_s"], "score_s": res["score_s"],
                             "accepted": n, "escalated": res["escalated"],
                             "device_s_per_accepted": device / n if n else None,
                             "accepted_set": res["accepted"]})  # fmt: skip
    sets = {tuple(map(tuple, row["accepted_set"])) for row in rows}
    same = len(sets) == 1
    if args.json:
        print(json.dumps({"rows": rows, "same_accepted_set": same}, indent=2))
        return
    print(f"{args.prompts} prompts, embedded mini-SD + CLIP, 2 one-thread CPU actors, "
          f"batch {args.batch}, {args.max_attempts} attempts; each side a process")  # fmt: skip
    print("| round | system | wall s | device-s | render s | score s | accepted | escalated "
          "| device-s per accepted |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['round']} | {row['system']} | {row['wall_s']:.1f} | {row['device_s']:.2f} "
              f"| {row['render_s']:.2f} | {row['score_s']:.2f} | {row['accepted']} "
              f"| {row['escalated']} | {row['device_s_per_accepted']:.3f} |")  # fmt: skip
    for side in ("renderq", "ray-data"):
        walls = [row["wall_s"] for row in rows if row["system"] == side]
        print(f"{side}: median wall {statistics.median(walls):.1f} s over {len(walls)} runs")
    print(f"same accepted (prompt, seed) set on every run: {same}")


if __name__ == "__main__":
    main()
