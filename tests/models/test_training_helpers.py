"""Small pure helpers of the training scripts (no training runs here)."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from renderq.models.shapes import clip_gate, common, evaluate, oracle, world


def test_hard_negatives_are_captions_the_scene_does_not_match() -> None:
    # Every negative, in the caption's own form, is one the pixel oracle rejects on the
    # scene's image, while the scene's caption in that form passes.
    rng = random.Random(8)
    for scene in world.sample_batch(rng, 120, two_shape_prob=0.5):
        form = clip_gate.random_form(scene, rng)
        caption = scene.caption(sizes=form[0], background=form[1])
        image = world.render(scene)
        assert oracle.matches(image, caption)
        negatives = clip_gate.negatives_for(scene, rng, [], form)
        assert len(negatives) == clip_gate.NEGATIVES
        for negative in negatives:
            assert not oracle.matches(image, negative), (caption, negative)
            assert clip_gate.form_of(negative)[1] == form[1]  # no clause added or dropped
        # A failed render's prompt comes first when given.
        assert clip_gate.negatives_for(scene, rng, ["x"], form)[0] == "x"


def test_two_shape_negatives_start_with_the_swaps_between_the_shapes() -> None:
    scene = world.Scene(
        "blue",
        (
            world.Shape("square", "red", "large", 20, 20, 14),
            world.Shape("circle", "white", "small", 48, 48, 8),
        ),
    )
    negatives = clip_gate.negatives_for(scene, random.Random(1), [])
    assert negatives[:3] == [
        "a large red circle and a small white square on a blue background",
        "a large white square and a small red circle on a blue background",
        "a small red square and a large white circle on a blue background",
    ]
    # Without size words the size swap is no mismatch, so it is not a negative.
    short = clip_gate.negatives_for(scene, random.Random(1), [], ((False, False), False))
    assert short[:2] == ["a red circle and a white square", "a white square and a red circle"]
    assert all("small" not in n and "large" not in n for n in short)


def test_scene_from_reading_puts_the_subject_first_and_sizes_by_extent() -> None:
    scene = world.Scene(
        "blue",
        (
            world.Shape("square", "red", "large", 20, 20, 14),
            world.Shape("circle", "white", "small", 48, 48, 8),
        ),
    )
    reading = oracle.read_image(world.render(scene))
    got = clip_gate.scene_from_reading(reading, ("white", "circle"))
    assert got.caption() == "a small white circle and a large red square on a blue background"
    assert clip_gate.scene_from_reading(reading, None).shapes[0].colour == "red"


def test_step_stream_is_reproducible() -> None:
    a = [s.caption() for s in world.sample_batch(common.step_rng(3, 17), 8)]
    b = [s.caption() for s in world.sample_batch(common.step_rng(3, 17), 8)]
    c = [s.caption() for s in world.sample_batch(common.step_rng(3, 18), 8)]
    assert a == b and a != c


def test_cosine_schedule_warms_up_and_decays() -> None:
    lrs = [common.cosine_lr(s, 1000, 1e-3, 100) for s in range(1000)]
    assert lrs[0] < lrs[50] < lrs[99] <= 1e-3
    assert lrs[999] < lrs[500] < lrs[100]
    assert min(lrs[100:]) >= 1e-4 - 1e-12


def test_zero_shot_label_set_covers_the_one_shape_grammar() -> None:
    labels = evaluate.single_shape_captions()
    assert len(labels) == len(set(labels)) == 2 * 8 * 3 * 7
    for label in labels:
        world.parse_caption(label)


def test_threshold_calibration_maximises_agreement() -> None:
    import numpy as np

    scores = np.array([10.0, 11.0, 12.0, 30.0, 31.0, 29.0])
    truth = np.array([False, False, False, True, True, True])
    threshold = evaluate.calibrate_threshold(scores, truth)
    assert 12.0 < threshold <= 29.0
    assert ((scores >= threshold) == truth).all()


def test_threshold_for_recall_keeps_that_share_of_good_images() -> None:
    rng = np.random.default_rng(0)
    scores = rng.normal(size=400)
    truth = scores + rng.normal(size=400) > 0
    for recall in (0.9, 0.95, 0.96, 1.0):
        threshold = evaluate.threshold_for_recall(scores, truth, recall)
        kept = (scores[truth] >= threshold).mean()
        assert recall <= kept < recall + 2 / truth.sum()


def test_detector_intervals_resample_prompts_and_the_calibrated_threshold() -> None:
    rng = np.random.default_rng(0)
    # 100 prompts, each scored on 4 images that agree with each other (a prompt's retries):
    # 400 images hold only 100 independent draws.
    prompt_scores = rng.normal(0.0, 1.0, 100)
    prompt_good = prompt_scores + rng.normal(0.0, 1.0, 100) > 0
    scores, truth = np.repeat(prompt_scores, 4), np.repeat(prompt_good, 4)
    groups = np.repeat(np.arange(100), 4)

    def width(f: dict[str, list[float]], name: str) -> float:
        lo, hi = f[f"g_{name}_ci"]
        return hi - lo

    by_image = evaluate.detector_figures(scores, truth, 0.0, "g_")
    by_prompt = evaluate.detector_figures(scores, truth, 0.0, "g_", groups)
    for name in ("recall", "specificity", "balanced_accuracy", "auc"):
        assert by_prompt[f"g_{name}"] == by_image[f"g_{name}"]  # the same point figures
        assert width(by_prompt, name) > 1.5 * width(by_image, name), name
    # A threshold that moves from round to round widens recall and specificity, not AUC.
    cuts = evaluate.calibration_thresholds(rng.normal(0.0, 1.0, 60), rng.random(60) < 0.5)
    assert cuts.std() > 0.05
    moving = evaluate.detector_figures(scores, truth, 0.0, "g_", groups, cuts - np.median(cuts))
    assert width(moving, "recall") > width(by_prompt, "recall")
    assert moving["g_auc_ci"] == by_prompt["g_auc_ci"]


def test_detector_figures_on_a_perfect_and_a_useless_gate() -> None:
    truth = np.array([True] * 30 + [False] * 10)
    perfect = evaluate.detector_figures(truth.astype(float), truth, 0.5, "g_")
    assert perfect["g_recall"] == perfect["g_specificity"] == perfect["g_auc"] == 1.0
    assert perfect["g_balanced_accuracy_ci"] == [1.0, 1.0]
    everything = evaluate.detector_figures(np.ones(40), truth, 0.5, "g_")
    assert everything["g_recall"] == 1.0 and everything["g_specificity"] == 0.0
    assert everything["g_balanced_accuracy"] == 0.5 and everything["g_auc"] == 0.5
    assert everything["g_agreement"] == 0.75  # the base rate a gate must beat


def test_fix_curve_counts_the_prompts_still_failing() -> None:
    prompts = ["a red circle"] * 6 + [
        "a large red circle and a small blue square on a black background"
    ] * 4
    # Prompt -> first passing attempt (0-based); absent: never passed.
    matched_at = {0: 0, 1: 0, 2: 1, 3: 1, 4: 2, 6: 0, 7: 3}
    qa = {"matched_at": matched_at, "first_subject": [True] * 10, "first_strict": [False] * 10}
    f = evaluate.qa_figures(prompts, qa)
    # 7 first attempts failed (2, 3, 4, 5, 7, 8, 9): 2 pass at attempt 2 of 7, then 1 of 5,
    # then 1 of 4; 3 never pass.
    assert f["fix_failed_first"] == 7
    assert f["fix_curve"] == [2 / 7, 1 / 5, 1 / 4]
    assert f["fix_cumulative"] == [2 / 7, 3 / 7, 4 / 7]
    assert f["never_pass"] == 3 / 7
    assert f["sd_first_attempt"] == 0.3 and f["sd_within_4_seeds"] == 0.7
    assert f["sd_first_attempt_one_shape"] == 2 / 6 and f["sd_first_attempt_two_shape"] == 1 / 4
    assert f["sd_prompts_full"] == 4 and f["sd_first_attempt_short"] == 2 / 6


def test_training_state_round_trips(tmp_path: Path) -> None:
    import torch

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    path = tmp_path / "ckpt.pt"
    assert common.resume_training(path, model, optimizer, "t") == 0  # nothing saved yet
    common.save_training(path, model, optimizer, 7)
    fresh = torch.nn.Linear(3, 2)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    assert common.resume_training(path, fresh, fresh_opt, "t") == 7
    assert torch.equal(fresh.weight, model.weight)
    assert fresh_opt.state_dict()["state"].keys() == optimizer.state_dict()["state"].keys()


def test_the_shipped_gate_threshold_is_the_calibrated_one() -> None:
    import json

    from renderq.backends.registry import DEFAULT_SCORER, scorer_default_threshold
    from renderq.models import shapes

    figures = json.loads((common.WEIGHTS_DIR / "figures.json").read_text())
    assert round(figures["gate_threshold"] / 100, 4) == shapes.DEFAULT_THRESHOLD
    assert scorer_default_threshold(DEFAULT_SCORER) == shapes.DEFAULT_THRESHOLD
    assert scorer_default_threshold(DEFAULT_SCORER, scale100=True) == 100 * shapes.DEFAULT_THRESHOLD
    assert scorer_default_threshold("some/other-clip") is None


def test_rendered_batch_captions_matched_renders_by_reading_or_by_prompt() -> None:
    image = np.zeros((64, 64, 3), np.uint8)
    data = {
        "images": [image, image],
        "prompts": [
            "a small red square and a large blue circle on a white background",
            "a small green circle on a black background",
        ],
        "captions": [
            "a small red square on a white background",
            "a small green square on a black background",
        ],
        "matched": [True, False],
    }
    for mode in ("reading", "prompt"):
        rng = random.Random(3)
        _, captions, negatives, _ = clip_gate._rendered_batch(data, rng, 40, mode)
        picked = [data["captions"].index(c) if c in data["captions"] else 0 for c in captions]
        for k, caption in enumerate(captions):
            own = negatives[k * clip_gate.NEGATIVES : (k + 1) * clip_gate.NEGATIVES]
            if picked[k] == 1:  # the failed render: its reading, its prompt a negative
                assert caption == data["captions"][1] and own[0] == data["prompts"][1]
            else:
                want = data["prompts"][0] if mode == "prompt" else data["captions"][0]
                assert caption == want and data["prompts"][1] not in own
        assert set(picked) == {0, 1}
    with pytest.raises(ValueError, match="'both'"):
        clip_gate._rendered_batch(data, random.Random(0), 1, "both")


def test_latent_sets_of_other_shapes_are_cached_apart(tmp_path: Path) -> None:
    from renderq.models.shapes import unet_train

    default = unet_train.latent_cache(tmp_path)
    assert default == tmp_path / "unet" / "latents.pt"  # the set earlier releases cached
    other = unet_train.latent_cache(tmp_path, 0.5, 40_000)
    assert other.name == "latents-40000-two50.pt"
    assert len({default, other, unet_train.latent_cache(tmp_path, 0.5)}) == 3
    with pytest.raises(ValueError, match="chunks of 500"):
        unet_train.build_latent_dataset(tmp_path, 0.3, 1234)


def test_a_render_cache_of_another_two_shape_share_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    cache = tmp_path / "renders.pt"
    image = np.zeros((64, 64, 3), dtype=np.uint8)
    common.save_checkpoint(cache, {"images": [image], "prompts": ["a red circle"], "rendered": 1})
    # Nothing is rendered (no pipeline is read): the cache's share (0.3 by default) differs.
    with pytest.raises(ValueError, match=r"two-shape share 0\.3, not 0\.5"):
        clip_gate.render_training_set(tmp_path / "no-pipeline", 4, cache, two_shape_share=0.5)
    # Its own share reads the cache back, one prompt long, without rendering anything.
    data = clip_gate.render_training_set(tmp_path / "no-pipeline", 1, cache)
    assert data["prompts"] == ["a red circle"] and data["rendered"] == 1


def test_gate_pairs_point_at_each_images_prompt_or_negative() -> None:
    data = {
        "prompts": ["a red circle", "a small blue square", "a green triangle"],
        "matched": [True, False, True],
    }
    # Two world images, then renders 0, 1, 2; render 2 passed but is captioned by its reading.
    captions = [
        "a red circle and a blue square",
        "a white circle",
        "a red circle",
        "a small blue circle",
        "a large green triangle",
    ]
    negatives = [f"n{i}" for i in range(len(captions) * clip_gate.NEGATIVES)]
    negatives[3 * clip_gate.NEGATIVES] = "a small blue square"  # the failed prompt comes first
    pairs, extra = clip_gate.gate_pairs(data, [0, 1, 2], captions, 2)
    text = captions + negatives + extra
    assert extra == ["a green triangle"]
    got = {(row, text[column], good, group, n) for row, column, good, group, n in pairs}
    assert got == {
        (0, "a red circle and a blue square", True, 0, 2),
        (1, "a white circle", True, 0, 1),
        (0, "n0", False, 0, 2),
        (1, f"n{clip_gate.NEGATIVES}", False, 0, 1),
        (2, "a red circle", True, 1, 1),
        (3, "a small blue square", False, 1, 1),
        (4, "a green triangle", True, 1, 1),
    }


def test_gate_loss_counts_bad_pairs_above_good_ones_within_a_group() -> None:
    torch = pytest.importorskip("torch")
    good = torch.tensor([True, False, True, False])
    ordered = torch.tensor([0.8, 0.6, 0.7, 0.5])
    swapped = torch.tensor([0.6, 0.8, 0.5, 0.7])
    one_group = torch.zeros(4, dtype=torch.long)
    low = clip_gate.gate_loss(ordered, good, one_group)
    high = clip_gate.gate_loss(swapped, good, one_group)
    assert float(low) < 0.01 < 5 < float(high)
    # A bad world pair above a good render is no fault: they are never compared.
    scores = torch.tensor([0.95, 0.75, 0.7, 0.3])
    apart = clip_gate.gate_loss(scores, good, torch.tensor([0, 0, 1, 1]))
    together = clip_gate.gate_loss(scores, good, one_group)
    assert float(apart) < 0.01 < 0.5 < float(together)
    none_good = clip_gate.gate_loss(ordered, torch.zeros(4, dtype=torch.bool), one_group)
    assert float(none_good) == 0.0


def test_a_balanced_gate_loss_will_not_lower_a_mostly_bad_stratum_whole() -> None:
    torch = pytest.importorskip("torch")
    # One-shape prompts: four good at 0.9, one bad at 0.8. Two-shape: one good at 0.7 (below
    # the one-shape bad: a single threshold must drop it or keep that bad), four bad at 0.5.
    scores = torch.tensor([0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.5, 0.5, 0.5, 0.5])
    good = torch.tensor([True] * 4 + [False, True] + [False] * 4)
    shapes = torch.tensor([1] * 5 + [2] * 5)
    groups = torch.zeros(10, dtype=torch.long)
    plain = float(clip_gate.gate_loss(scores, good, groups))
    balanced = float(clip_gate.gate_loss(scores, good, groups, shapes))
    # Plain: 1 of 25 pairs out of order. Balanced: 1 of the 1 pairs of (two-shape good,
    # one-shape bad), a quarter of the loss.
    assert plain == pytest.approx(float(torch.nn.functional.softplus(torch.tensor(5.0))) / 25, 0.05)
    assert balanced > 5 * plain


def test_caption_forms_are_every_form_with_the_chances_training_captions_are_drawn_by() -> None:
    import collections

    rng = random.Random(5)
    for scene in world.sample_batch(rng, 20, 0.5):
        forms = world.caption_forms(scene)
        assert len(forms) == 4 * len(scene.shapes) and len({c for c, _ in forms}) == len(forms)
        assert sum(p for _, p in forms) == pytest.approx(1.0)
        for caption, _ in forms:  # each states only what the scene shows
            parsed = world.parse_caption(caption)
            assert [(k, c) for k, c, _ in parsed.shapes] == [
                (s.kind, s.colour) for s in scene.shapes
            ]
            assert parsed.background in (None, scene.background)
        drawn = collections.Counter(world.training_caption(scene, rng) for _ in range(4000))
        for caption, p in forms:
            assert abs(drawn[caption] / 4000 - p) < 0.03, caption
    two = world.sample_batch(random.Random(1), 50, 1.0)[0]
    short = dict(world.caption_forms(two, short_share=0.5))
    assert short[two.caption(sizes=False, background=False)] == pytest.approx(0.25)
    assert short[two.caption()] == pytest.approx(0.4 * 0.5)
    with pytest.raises(ValueError, match="short_share must be in"):
        world.caption_forms(two, short_share=0.95)


def test_form_chances_follow_caption_forms_order_per_shape_count() -> None:
    pytest.importorskip("torch")
    from renderq.models.shapes import unet_train

    chances = unet_train.form_chances(0.45)
    assert len(chances[1]) == 4 and len(chances[2]) == 8
    assert float(chances[1].sum()) == pytest.approx(1.0) == float(chances[2].sum())
    scene = world.sample_batch(random.Random(2), 50, 1.0)[0]
    assert [p for _, p in world.caption_forms(scene, 0.45)] == pytest.approx(chances[2].tolist())


@pytest.mark.slow
def test_the_unet_recipe_chains_its_phases_and_a_finished_one_trains_nothing_again(
    tmp_path: Path,
) -> None:
    pytest.importorskip("diffusers")
    import torch
    from safetensors.torch import load_file

    from renderq.models.shapes import build, unet_train

    torch.set_num_threads(1)
    build.unpack_shipped(common.WEIGHTS_DIR, tmp_path)
    recipe = (
        unet_train.UnetPhase(2, 1e-3, 1, short_share=0.0, two_shape_share=0.5, dataset_size=500),
        unet_train.UnetPhase(3, 4e-4, 1, short_share=0.3, two_shape_share=0.5, dataset_size=500),
    )
    out = unet_train.train_unet_recipe(tmp_path, recipe=recipe)
    assert out == tmp_path / "export" / "unet"
    steps = [common.load_checkpoint(tmp_path / f / "ckpt.pt")["step"] for f in ("unet", "unet-2")]
    assert steps == [2, 3]  # each phase ran its own schedule, in its own folder
    assert (out / "train_step.txt").read_text() == "3\n"
    # The second phase started from the first one's average (its snapshot is kept)...
    first = load_file(tmp_path / "unet" / "export" / "diffusion_pytorch_model.safetensors")
    final = load_file(out / "diffusion_pytorch_model.safetensors")
    assert first.keys() == final.keys()
    assert any(not torch.equal(first[k], final[k]) for k in first)
    # ... and the forms draw from one latent set, encoded once under unet/.
    assert [p.name for p in (tmp_path / "unet").glob("latents*.pt")] == [
        "latents-500-two50-forms.pt"
    ]
    # Run again: both phases are complete, so nothing trains and the result is the same.
    again = unet_train.train_unet_recipe(tmp_path, recipe=recipe)
    assert all(
        torch.equal(final[k], v)
        for k, v in load_file(again / "diffusion_pytorch_model.safetensors").items()
    )


def test_stage_unet_runs_the_recipe_unless_an_option_asks_for_one_schedule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    from renderq.models.shapes import __main__ as cli
    from renderq.models.shapes import unet_train

    calls: list[tuple[str, dict[str, object]]] = []
    monkeypatch.setattr(
        unet_train, "train_unet_recipe", lambda ck, resume: calls.append(("recipe", {}))
    )
    monkeypatch.setattr(
        unet_train, "train_unet", lambda ck, resume, init_from, **kw: calls.append(("one", kw))
    )
    base = ["train", "--stage", "unet", "--threads", "1", "--checkpoints", str(tmp_path)]
    cli.main(base)
    cli.main([*base, "--steps", "50", "--short-share", "0.4"])
    assert calls == [("recipe", {}), ("one", {"steps": 50, "short_share": 0.4})]
    assert unet_train.UNET_RECIPE[0].short_share == 0.3  # the mix of forms from the first step


def test_the_gate_stage_trains_on_one_render_set_per_share_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("torch")
    from renderq.models.shapes import __main__ as cli

    image = np.zeros((64, 64, 3), dtype=np.uint8)
    for share, prompt in ((0.5, "a red circle"), (0.75, "a blue square and a red circle")):
        cache = clip_gate.render_cache(tmp_path, 0 if share == 0.5 else 1, share)
        data = {"images": [image], "prompts": [prompt], "rendered": 1, "two_shape_share": share}
        common.save_checkpoint(cache, data)
    trained: list[dict[str, object]] = []
    monkeypatch.setattr(
        clip_gate, "train_clip_gate", lambda ck, out, renders, **kw: trained.append(renders)
    )
    base = ["train", "--stage", "clip-gate", "--threads", "1", "--checkpoints", str(tmp_path)]
    # Both caches are full, so nothing renders (no pipeline is read from --render-with).
    cli.main([*base, "--render-with", str(tmp_path / "none"), "--renders", "1",
              "--render-two-shape-share", "0.5,0.75"])  # fmt: skip
    assert clip_gate.render_cache(tmp_path, 0, 0.5).name == "renders.pt"  # one set's old name
    assert clip_gate.render_cache(tmp_path, 1, 0.75).name == "renders-0.75.pt"
    (renders,) = trained
    assert renders["prompts"] == ["a red circle", "a blue square and a red circle"]
    assert np.asarray(renders["images"]).shape == (2, 64, 64, 3)
    assert len(renders["captions"]) == len(renders["matched"]) == 2 and renders["rendered"] == 2
    # The other order asks renders.pt for share 0.75: refused, naming both shares.
    with pytest.raises(ValueError, match=r"two-shape share 0\.5, not 0\.75"):
        cli.main([*base, "--render-with", str(tmp_path / "none"), "--renders", "1",
                  "--render-two-shape-share", "0.75,0.5"])  # fmt: skip


@pytest.mark.parametrize("value", ["0.5,x", "1.5", "0.5,0.5"])
def test_a_bad_render_two_shape_share_is_refused_by_name(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from renderq.models.shapes import __main__ as cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--stage", "clip-gate", "--render-two-shape-share", value])
    assert exit_.value.code == 2 and repr(value) in capsys.readouterr().err
