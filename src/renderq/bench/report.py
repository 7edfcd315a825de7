"""Bench reports: a markdown table and matplotlib plots (written as PNG files)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from renderq.bench.harness import FIGURES, Limit, ModeRun, summarise
from renderq.bench.stability import STABILITY_BOUND
from renderq.core.cost import Profile
from renderq.core.types import Stage


def _f(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def markdown(
    runs: Sequence[ModeRun], limit: Limit, title: str, p99_bound_s: float | None = None
) -> str:
    """One row per mode and failure rate (real runs: per round, with its stability verdict;
    over several rounds, each figure's median and range)."""
    lines = [
        f"### {title}",
        "",
        f"Limit: batch {limit.batch_size}, {limit.images_per_second:.3f} images per "
        "device-second (best static batch, offline, from the profile).",
        "",
        "| mode | failure rate | efficiency | utilisation | GPU-h total | GPU-h regen | "
        "p50 s | p99 s | p99 bound met | mean batch | accepted | escalated |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    judged = any(r.stability is not None for r in runs)
    rounds = len({r.round for r in runs})
    if judged:
        lines[-2] = lines[-2].replace("| mode |", "| mode | round | run |")
        lines[-1] += "---|---|"
    for r in runs:
        h = r.result.ledger.gpu_hours()
        met = "-" if r.meets_p99 is None else ("yes" if r.meets_p99 else "no")
        if r.stability is not None and not r.stability.stable:
            met = "not judged (unstable)"
        cells = "" if r.stability is None else f" {r.round + 1} | {r.stability.verdict()} |"
        lines.append(
            f"| {r.mode} |{cells} {r.failure_rate:.2f} | {_f(r.efficiency, '.3f')} | "
            f"{_f(r.utilisation, '.3f')} | {h['total']:.4f} | {h['regen']:.4f} | "
            f"{_f(r.result.percentile(50), '.2f')} | {_f(r.result.percentile(99), '.2f')} | "
            f"{met} | {r.result.mean_batch_size:.1f} | {r.result.accepted} | "
            f"{r.result.escalated} |"
        )
    refs = [r for r in runs if r.reference is not None and r.reference_batch_s]
    if refs:
        lines += [
            "",
            f"Against the reference (batch {limit.batch_size} timed straight through the "
            "executor before and after each mode and, outside the server scenario, between "
            "its batches; their median, and paired: each stretch of the mode priced at the "
            "reference batch right after it): "
            + "; ".join(
                f"{r.mode} {_f(r.efficiency_reference, '.3f')} "
                f"(reference {r.reference:.3f} images/s, {len(r.reference_batch_s)} batches "
                f"{min(r.reference_batch_s):.2f}-{max(r.reference_batch_s):.2f} s"
                + ("" if r.paired is None else f"; paired {r.paired:.3f}")
                + ")"
                for r in refs
            )
            + ".",
        ]
        lines += _limit_check(runs, limit)
    if judged:
        lines += ["", *_stability_lines(runs)]
    if rounds > 1:
        lines += ["", *summary_table(summarise(runs, p99_bound_s), rounds)]
    return "\n".join(lines) + "\n"


def _limit_check(runs: Sequence[ModeRun], limit: Limit) -> list[str]:
    """A warning where this machine's reference batches and the limit disagree.

    The limit comes from the profile (``--profile``, perhaps measured on another day or
    machine); a load given as a share of it is then a different share of what the device
    does here. Beyond the stability bound (``STABILITY_BOUND`` unless the runs say), say so.
    """
    seen = [r.reference for r in runs if r.reference]
    if not seen or limit.images_per_second <= 0:
        return []
    bound = next((r.stability.bound for r in runs if r.stability), STABILITY_BOUND)
    rate = statistics.median(seen)
    ratio = rate / limit.images_per_second
    if 1 / (1 + bound) <= ratio <= 1 + bound:
        return []
    return [
        "",
        f"- **The limit is not this machine's speed**: the reference batches ran at "
        f"{rate:.3f} images/s, {ratio:.2f}x the limit's "
        f"{limit.images_per_second:.3f}, so a load given as a share of the limit offered "
        f"{1 / ratio:.2f}x that share of what the device did here. Measure the profile on "
        "this machine (leave out --profile) or give --rate.",
    ]


def _stability_lines(runs: Sequence[ModeRun]) -> list[str]:
    bound = next(r.stability.bound for r in runs if r.stability is not None)
    lines = [
        f"Stability (bound {bound:.2f}: the slowest reference batch within {1 + bound:.2f}x "
        f"the fastest, the mode's smoothed speed within {1 + bound:.2f}x, no efficiency "
        f"above {1 + bound:.2f}): "
        + "; ".join(
            f"{r.mode} round {r.round + 1} {r.stability.verdict()}"
            f" (reference spread {_x(r.stability.reference_spread)}, "
            f"drift {_x(r.stability.drift)})"
            for r in runs
            if r.stability is not None
        )
        + "."
    ]
    for r in runs:
        if r.stability is not None and not r.stability.stable:
            lines.append(
                f"- **{r.mode} round {r.round + 1} is unstable**, its figures measure the "
                "machine, not the mode, and no target is judged on it: "
                + "; ".join(r.stability.reasons)
                + "."
            )
    return lines


def summary_table(summary: dict[str, dict[str, Any]], rounds: int) -> list[str]:
    """Median (range) of each figure per mode over its rounds."""
    head = " | ".join(label for _, label in FIGURES)
    lines = [
        f"Over {rounds} rounds (each round starts at the next mode): median (min-max).",
        "",
        f"| mode | rounds stable | {head} | p99 bound met |",
        "|---|---|" + "---|" * len(FIGURES) + "---|",
    ]
    for mode, s in summary.items():
        cells = []
        for key, _ in FIGURES:
            f = s["figures"][key]
            spec = ".2f" if key.endswith("_s") or key == "device_seconds" else ".3f"
            cells.append(
                "-"
                if f["median"] is None
                else f"{f['median']:{spec}} ({f['min']:{spec}}-{f['max']:{spec}})"
            )
        met = s["meets_p99_bound"]
        verdict = "-" if met is None else ("yes" if met else "no")
        if not s["stable"]:
            verdict = "not judged (unstable)"
        lines.append(
            f"| {mode} | {s['rounds_stable']}/{s['rounds']} | {' | '.join(cells)} | {verdict} |"
        )
    return lines


def fidelity_table(rows: Sequence[dict[str, Any]]) -> str:
    """Real against simulated device-seconds and p99, with relative errors."""
    lines = [
        "",
        "### Simulator against the real run (same arrivals, same QA outcomes)",
        "",
        "Calibrated from the run: medians per batch size, the machine's speed over the run "
        "and the engine's hand-offs; *medians only* leaves out the last two. The real p99's "
        "95% interval (order statistics; open above when too few requests lie past it) "
        "says how far another run of the same trace could land.",
        "",
        "| mode | device-s real | device-s sim | error | p99 real s | real p99 95% CI s "
        "| p99 sim s | error | sim in CI | p99 medians only s | error | speed range "
        "| hand-offs ms render / score |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        d, p, c = r["device_seconds"], r["p99_s"], r["calibration"]
        speed = "-" if c["speed_min"] is None else f"{c['speed_min']:.2f}-{c['speed_max']:.2f}"
        lines.append(
            f"| {_mode(r)} | {d['real']:.2f} | {d['sim']:.2f} | {_pct(d['rel_error'])} | "
            f"{_f(p['real'], '.2f')} | {_ci(p['real_ci'])} | "
            f"{_f(p['sim'], '.2f')} | {_pct(p['rel_error'])} | {_yes(p['sim_in_real_ci'])} | "
            f"{_f(p.get('sim_medians_only'), '.2f')} | "
            f"{_pct(p.get('rel_error_medians_only'))} | {speed} | "
            f"{c['render_overhead_s'] * 1e3:.1f} / {c['score_overhead_s'] * 1e3:.1f} |"
        )
    return "\n".join(lines) + "\n"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _mode(row: dict[str, Any]) -> str:
    return row["mode"] if row.get("round") is None else f"{row['mode']} (round {row['round'] + 1})"


def _ci(ci: dict[str, Any]) -> str:
    low, high = ci["low"], ci["high"]
    if low is None:
        return "-"
    return f"{low:.2f}-{'open' if high is None else f'{high:.2f}'}"


def _yes(v: bool | None) -> str:
    return "-" if v is None else ("yes" if v else "no")


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:+.1f}%"


def plots(runs: Sequence[ModeRun], profile: Profile, out: Path) -> list[Path]:
    """Latency CDF per mode, device-seconds per stage per mode, cost against batch size."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError("plots need matplotlib: pip install 'renderq[bench]'") from exc
    out.mkdir(parents=True, exist_ok=True)
    written = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for r in runs:
        lat = sorted(r.result.latencies)
        if lat:
            ax.step(
                lat, [(i + 1) / len(lat) for i in range(len(lat))], where="post", label=label(r)
            )
    ax.set(xlabel="latency (s)", ylabel="share of requests", title="Latency CDF per mode")
    ax.legend(fontsize=8)
    written.append(_save(fig, out / "latency_cdf.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    bottom = [0.0] * len(runs)
    for stage in Stage:
        vals = [r.result.ledger.seconds.get(stage, 0.0) for r in runs]
        ax.bar([label(r) for r in runs], vals, bottom=bottom, label=stage.value)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set(ylabel="device-seconds", title="Device-seconds per stage")
    ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    ax.legend(fontsize=8)
    written.append(_save(fig, out / "device_seconds_by_stage.png"))

    sizes = list(range(1, profile.render_cap + 1))
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(sizes, [n / profile.render.latency(n) for n in sizes], label="images / s")
    ax.set(
        xlabel="batch size",
        ylabel="images per device-second",
        title=f"{profile.name}: throughput and cost per image",
    )
    ax2 = ax.twinx()
    ax2.plot(
        sizes, [profile.render.latency(n) / n for n in sizes], color="tab:red", label="s / image"
    )
    ax2.set_ylabel("device-seconds per image")
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles=handles, fontsize=8, loc="center right")
    written.append(_save(fig, out / "batch_size_curve.png"))
    return written


def label(r: ModeRun) -> str:
    """A run's label in plots: mode and failure rate."""
    return f"{r.mode} @ {r.failure_rate:.2f}"


def _save(fig: object, path: Path) -> Path:
    fig.tight_layout()  # type: ignore[attr-defined]
    fig.savefig(path, dpi=100)  # type: ignore[attr-defined]
    import matplotlib.pyplot as plt

    plt.close(fig)  # type: ignore[arg-type]
    return path
