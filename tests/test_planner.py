"""The time planner's decisions, driven by a fake clock (its one seam) so they are exact."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def make(planner_module, budget, folds=5, epochs=30, reserve=None, **kw):
    """A planner on a fake clock, its lines kept; `reserve`: PredictionReserve's keywords (start, fixed_s),
    as make_planner passes the run's start and --predict-reserve."""
    clock, lines = Clock(), []
    prediction = planner_module.PredictionReserve(budget, **(reserve or {}))
    planner = planner_module.TimePlanner(
        budget, folds, epochs, prediction=prediction, clock=clock, log=lines.append, **kw
    )
    return planner, clock, lines


def first_epoch(planner, clock, s_per_step, batches=40, valid_batches=10):
    """Fold 0, epoch 1: warm-up steps (slow: compile / autotune), then steady steps."""
    planner.times.begin_fold(0)
    planner.times.begin_epoch(batches, valid_batches)
    for i in range(batches):
        clock.t += 5.0 if i < planner.times.WARMUP_BATCHES else s_per_step
        assert not planner.tick(i)
    clock.t += s_per_step * 2 / 3 * valid_batches  # validation
    planner.end_epoch(1)


@pytest.mark.parametrize(
    "s_per_step,folds,epochs,cuts",
    [
        # limit = 80% of (600 - 90 reserve - 5 finish - ~10 s elapsed) = ~396 s; an epoch is 46.7 steps' worth
        (0.01, 5, 30, None),  # 5 x 30 x 0.47 s = 70 s: fits
        (0.07, 3, 30, "folds 5->3"),  # 150 x 3.3 s = 490 s; 3 folds: 294 s
        (0.12, 3, 21, "folds 5->3, epochs 30->21"),  # then epochs -30%: 63 x 5.6 s = 353 s
        (0.16, 3, 15, "folds 5->3, epochs 30->15"),  # then epochs -50%: 45 x 7.5 s = 336 s
        # then folds towards 1: 2 folds fit, and get epochs back: 2 x 16 x 11.7 s = 373 s (17: 397 s)
        (0.25, 2, 16, "folds 5->2, epochs 30->16"),
        (1.00, 1, 8, "folds 5->1, epochs 30->8"),  # last resort: 1 fold, epochs fit: 8 x 46.7 s = 373 s
    ],
)
def test_plan_cuts_folds_then_epochs_then_folds_to_one(project_modules, s_per_step, folds, epochs, cuts):
    plan = project_modules.planner
    planner, clock, lines = make(plan, budget=600)
    first_epoch(planner, clock, s_per_step)
    assert (planner.folds, planner.epochs) == (folds, epochs), lines
    assert lines[0].startswith(f"TIME ESTIMATE: {s_per_step:.3f} s/step x 40 steps")
    if cuts is None:
        assert lines[1] == "TIME PLAN: fits, kept folds=5 epochs=30"
    else:
        assert lines[1].startswith("TIME PLAN: estimate ") and lines[1].endswith(f"-> {cuts}")
        assert "> 80% of" in lines[1]


def test_epochs_never_cut_below_the_floor_before_folds_go(project_modules):
    plan = project_modules.planner
    planner, clock, lines = make(plan, budget=600, min_epochs=20)
    first_epoch(planner, clock, 0.16)  # without the floor: 3 folds x 15 epochs (above)
    # epochs stop at the floor (21 -> 20, not 15), so folds go to 2, which then get epochs back
    assert (planner.folds, planner.epochs) == (2, 26), lines
    assert lines[1].endswith("-> folds 5->2, epochs 30->26")


def test_replan_after_a_slow_first_fold(project_modules):
    plan = project_modules.planner
    planner, clock, lines = make(plan, budget=1000, folds=5, epochs=4)
    first_epoch(planner, clock, 0.05)  # the estimate says it fits
    assert (planner.folds, planner.epochs) == (5, 4)
    for epoch in (2, 3, 4):  # then the data loader slows down: 60 s epochs
        planner.times.begin_epoch(40, 10)
        clock.t += 60
        planner.end_epoch(epoch)
    # after epoch 2: 2 + 4 x 4 epochs x 60 s = 18 min > 95% of the ~13 min left -> 3 folds fit
    assert (planner.folds, planner.epochs) == (3, 4), lines
    assert lines[-1].startswith("TIME PLAN: re-plan at 60s/epoch: need 18.0 min > 95% of ")
    assert lines[-1].endswith("-> folds 5->3")
    planner.end_fold(0, first=True)  # fold 0 took 19% of the budget: no 20% trigger
    assert not any("(> 20%)" in x for x in lines)
    lines.clear()

    planner2, clock2, lines2 = make(plan, budget=1000, folds=5, epochs=2)
    first_epoch(planner2, clock2, 0.05)
    planner2.times.begin_epoch(40, 10)
    clock2.t += 190  # one very slow epoch: the first fold has used > 20% of the budget
    planner2.end_epoch(2)
    planner2.end_fold(0, first=True)
    assert any("fold 0 took" in x and "(> 20%)" in x for x in lines2), lines2
    assert planner2.folds < 5


def test_a_cut_prices_each_plan_with_its_own_reserve(project_modules):
    """On an H200 (detection, run.py --budget 60s) fold 0's first validation pass priced each checkpoint at
    8.5 s or more of prediction: 3 folds' reserve ate the training time left, and the re-plan cut to 1 fold with
    that reserve still counted, so 1 epoch of the 6 that fit. A plan of fewer folds leaves predict.py
    fewer checkpoints: each candidate is priced with its own reserve."""
    plan = project_modules.planner
    planner, clock, lines = make(plan, budget=100, folds=3, epochs=6, min_epochs=1, elapsed_s=40.0)
    planner.times.begin_fold(0)
    planner.times.begin_epoch(10, 2)
    for i in range(10):
        clock.t += 1.0 if i < planner.times.WARMUP_BATCHES else 0.2
        assert not planner.tick(i)
    assert (planner.folds, planner.epochs) == (3, 4), lines  # the first plan: 2.3 s/epoch, a 15 s reserve
    clock.t += 0.5  # validation, measured: a checkpoint's share of prediction is 10 s
    planner.prediction.note_inference(7.0, 100, test_rows=100, views=1, decode_s_per_image=0.0, model_s=1.0)
    assert [planner.prediction.seconds(f) for f in (3, 2, 1)] == [47.5, 37.5, 27.5]  # 17.5 s + 10 s a fold
    planner.end_epoch(1)
    assert lines[-1].startswith("TIME PLAN: re-plan at 2.3s/epoch: need 25s > 95% of 3.4s training time left")
    assert lines[-1].endswith("-> folds 3->2, epochs 4->3"), lines  # priced with 3 folds' reserve: epochs 4->1
    left = project_modules.replanning.REPLAN_FRACTION * planner.training_left()
    at = planner.times.progress(planner.parallel)
    assert at.need(2.27, planner.folds, planner.epochs) <= left  # the plan fits its own reserve
    assert at.need(2.27, planner.folds, planner.epochs + 1) > left  # and no more epochs would


@pytest.mark.parametrize("reserve", ["rule", "measured", "fixed"])
def test_a_budget_that_leaves_no_time_to_train_names_the_budget_that_does(project_modules, reserve):
    """Tables: the models are cut when the start, the finish and predict.py's reserve leave no time
    (a 6 s run.py budget). The line names the budget above which they leave some: the same planner,
    started the same, has training time just above it and none just below, whichever reserve rule
    holds (15% before a measure; the trees' measured start; --predict-reserve's seconds)."""
    plan, fixed = project_modules.planner, 26.0 if reserve == "fixed" else None

    def planner_at(budget):
        planner, clock, lines = make(plan, budget=budget, folds=3, epochs=30, elapsed_s=2.6, reserve={"fixed_s": fixed})
        if reserve == "measured":
            planner.prediction.note_startup()  # predict.py's start (10 s here) in the reserve: 17.5 s
        return planner

    short = planner_at(6.0)
    assert short.training_left() <= 0
    line = project_modules.replanning.no_training_line(short)
    spent = 2.6 + plan.FINISH_S
    need = short.prediction.budget_leaving(spent, 3)
    expected = {"rule": spent / 0.85, "measured": spent + 17.5, "fixed": spent + (fixed or 0)}[reserve]
    assert need == pytest.approx(expected)
    assert line == (
        f"TIME PLAN: the budget 6.0s leaves no time to train (2.6s spent before the first model, 5.0s for the end, "
        f"{plan.fmt_s(short.reserve())} kept for predict.py): the submission will be "
        f"train.py's fallback; a budget above {plan.fmt_s(need)} leaves time to train"
    )
    assert planner_at(need + 0.01).training_left() > 0 >= planner_at(need - 0.01).training_left()


def test_deadline_guard_and_sigterm(project_modules):
    plan = project_modules.planner
    planner, clock, lines = make(plan, budget=100, folds=1, epochs=30)
    planner.times.begin_fold(0)
    for epoch in range(1, 30):
        assert planner.can_start_epoch()
        planner.times.begin_epoch(2, 1)
        clock.t += 10
        planner.end_epoch(epoch)
        if clock.t - 1000 + 10 + planner.reserve() + project_modules.planner.FINISH_S > 100:
            break
    # elapsed + next epoch + reserve (15) + finish (5) > 100: the next epoch must not start
    assert not planner.can_start_epoch() and planner.stop_reason == "deadline" and epoch == 8
    assert lines[-1].startswith("DEADLINE: ") and "prediction runs next" in lines[-1]
    finish = project_modules.planner.FINISH_S
    assert clock.t - 1000 + planner.reserve() + finish <= 100  # the reserve is still there for predict
    assert "+ finish 5.0s > budget 100s" in lines[-1]
    # a mask's grown seeds are judged by a pass at train.py's end (seeds_oof.py): growth holds it, so
    # the deadline comes that much earlier, and the line's finish says so (its sum still passes the budget)
    held, hclock, hlines = make(plan, budget=100, folds=1, epochs=30)
    held.prediction.fold_s, held.prediction.extra_models = 2.0, 1  # one grown seed: its pass and its first seed's
    held.prediction.judge_grown(3.0)
    assert held.training_time() == planner.training_time() - 2 * 2.0 * 3.0
    held.times.begin_fold(0)
    for epoch in range(1, 30):
        if not held.can_start_epoch():
            break
        held.times.begin_epoch(2, 1)
        hclock.t += 10
        held.end_epoch(epoch)
    assert held.stop_reason == "deadline" and epoch - 1 == 6, epoch  # 6 epochs trained: the unheld run trained 8
    assert "+ finish 17s > budget 100s" in hlines[-1], hlines[-1]

    mid, mclock, _ = make(plan, budget=100, folds=1, epochs=30)
    mid.times.begin_fold(0)
    mid.times.begin_epoch(1000, 1)
    mclock.t += 86  # inside an epoch, past budget - reserve: stop at the next batch
    assert mid.tick(500) and mid.stop_reason == "deadline"

    sig, _, _ = make(plan, budget=None, folds=1, epochs=3)
    assert not sig.tick(0)
    sig.request_stop("SIGTERM")
    assert sig.tick(1) and not sig.can_start_epoch()


def test_reserve_covers_the_measured_prediction_time(project_modules):
    plan = project_modules.planner
    planner, _, _ = make(plan, budget=3600, folds=5, epochs=10, reserve={"start": 8.0})
    assert planner.reserve() == pytest.approx(540)  # 15% before anything is measured
    # validation: 2,000 images in 40 s -> 0.02 s/image; test: 10,000 images x 5 folds x 2 TTA views
    planner.prediction.note_inference(40.0, 2000, test_rows=10_000, views=2, decode_s_per_image=0.004, model_s=2.0)
    expected = 1.25 * (8.0 + 5 * (2.0 + 0.02 * 10_000 * 2) + 0.004 * 10_000) + planner.prediction.END_S
    assert planner.reserve() == pytest.approx(expected) and planner.reserve() > 0.15 * 3600
    assert planner.training_left() == pytest.approx(3600 - expected - project_modules.planner.FINISH_S)
    # the budget's time for training, from the start: the first estimate and growth read it
    assert planner.training_time() == pytest.approx(planner.training_left() + planner.elapsed())
    assert planner.training_time(1) > planner.training_time() > planner.training_time(10)  # a fold's reserve each
    # a prediction measured at seconds keeps 8% of the budget, not 15%: the time between is training's
    quick, _, _ = make(plan, budget=3600, folds=5, epochs=10, reserve={"start": 8.0})
    quick.prediction.note_inference(1.0, 2000, test_rows=1000, views=1, decode_s_per_image=0.0, model_s=1.0)
    assert quick.prediction.need_s(quick.folds) < 0.08 * 3600 and quick.reserve() == pytest.approx(0.08 * 3600)
    trees, _, _ = make(plan, budget=3600, folds=5, epochs=10, reserve={"start": 8.0})
    trees.prediction.note_startup()  # the trees measure no validation pass: their start is the measure
    assert trees.reserve() == pytest.approx(0.08 * 3600)


def test_a_predict_started_beside_train_is_reserved_without_its_imports_once_it_says_so(
    project_modules, monkeypatch, tmp_path
):
    """run.py starts predict.py beside train.py (--predict-beside): its interpreter start and
    imports are paid while train.py trains, so once predict.py touches the file run.py named
    (KAGTPL_PREDICT_READY) the reserve counts only what train.py did after its own imports. On
    an H100 the whole start kept 14-27 s of a 60 s budget for a predict.py of 7-11 s. Until then
    the whole start counts: in CI a predict.py at nice 10 on a loaded machine was not ready 39 s
    into a 40 s run whose reserve had left its imports out, and the fallback was handed in."""
    import signal

    plan = project_modules.planner
    ready = tmp_path / "predict-ready"
    monkeypatch.setenv(plan.READY_ENV, str(ready))
    monkeypatch.setattr(plan, "PROCESS_START", __import__("time").time() - 2.0)  # machinery imported 2 s ago
    monkeypatch.setattr(plan, "process_age", lambda: 12.0)  # the process started 12 s ago
    previous = signal.getsignal(signal.SIGTERM)
    try:
        alone = plan.make_planner("60", 0.0, folds=3, epochs=8)
        beside = plan.make_planner("60", 0.0, folds=3, epochs=8, beside=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    alone, beside = alone.prediction, beside.prediction
    lines = []
    beside.start.log = lines.append
    for reserve in (alone, beside):
        reserve.note_inference(1.0, 100, test_rows=100, views=1, decode_s_per_image=0.0, model_s=1.0)
    assert alone.start.seconds() == beside.start.seconds() == 12.0  # predict.py has not said it is ready
    assert beside.need_s(3) == alone.need_s(3) and not lines
    ready.touch()  # predict.py's imports are paid (submission.say_ready)
    assert alone.need_s(3) - beside.need_s(3) == pytest.approx(1.25 * 10.0, abs=0.7)
    assert len(lines) == 1 and re.fullmatch(
        r"RESERVE: predict.py is ready beside train.py \(its imports paid\): its start in the reserve is 2\.\ds, "
        r"not 12\.0s",
        lines[0],
    ), lines
    beside.need_s(3)
    assert len(lines) == 1  # said once
    ready.unlink()  # run.py started a killed predict.py again: its imports are not paid
    assert beside.need_s(3) == alone.need_s(3)
    assert lines[1:] == [
        "RESERVE: predict.py started again beside train.py: its start in the reserve is 12.0s until it is ready"
    ]


def test_the_reserve_keeps_predict_pys_own_end(project_modules):
    """predict.py's deadline is run.py's END_S before run.py's end, which is END_S before the
    budget's, and it keeps FoldClock.MARGIN_S for the write: time the reserve must hold beyond
    the folds (without it, a 3-fold detection run on an H100 handed in the fallback)."""
    import re
    from pathlib import Path

    run_py = (Path(__file__).parents[1] / "template" / "run.py.jinja").read_text()
    end_s = float(re.search(r"^END_S = ([\d.]+)", run_py, re.M).group(1))
    margin = project_modules.submission.FoldClock.MARGIN_S
    assert project_modules.reserve.PredictionReserve.END_S == 2 * end_s + margin


def test_run_py_safety_net_comes_after_the_planned_end_of_training(project_modules):
    """run.py SIGTERMs a train.py still running at SAFETY_NET of the budget. A healthy run ends
    training by 1 - the reserve's FRACTION (1 - MEASURED_FRACTION once measured) less FINISH_S, then
    scores, reports and exits: the net must leave room for that, or it kills runs that did
    nothing wrong (it once sat at exactly 85%)."""
    rules = project_modules.planner.TimePlanner
    for budget in (60.0, 75.0, 600.0, 9 * 3600.0):
        planner = rules(budget, folds=5, epochs=10)
        end_of_training = budget - planner.reserve() - project_modules.planner.FINISH_S
        assert project_modules.planner.SAFETY_NET * budget - end_of_training >= 0.05 * budget
        planner.prediction.note_inference(0.1, 1000, test_rows=10, views=1, decode_s_per_image=0.0, model_s=0.1)
        latest = budget - planner.reserve() - project_modules.planner.FINISH_S  # measured: the 8% floor, the latest end
        assert project_modules.planner.SAFETY_NET * budget - latest >= max(5.0, 0.03 * budget), (budget, latest)


def test_no_budget_plans_nothing(project_modules):
    plan = project_modules.planner
    planner, clock, lines = make(plan, budget=None)
    first_epoch(planner, clock, 10.0)
    assert (planner.folds, planner.epochs) == (5, 30) and lines == []
    assert planner.status_line() == "TIME: elapsed 7.6 min, no budget, plan folds=5 epochs=30"


def test_a_time_line_is_due_when_the_plan_changes_not_every_epoch(project_modules):
    """fold.py prints TIME after an epoch only when plan_changed (and once at each fold's end):
    the first estimate and a re-plan set it, an epoch that changes nothing does not."""
    planner, clock, lines = make(project_modules.planner, budget=1000, folds=5, epochs=4)
    first_epoch(planner, clock, 0.05)  # the first estimate: a plan was made
    assert planner.plan_changed
    planner.status_line()
    assert not planner.plan_changed
    planner.times.begin_epoch(40, 10)
    clock.t += 3  # as estimated: nothing changes
    planner.end_epoch(2)
    assert not planner.plan_changed
    for epoch in (3, 4):  # 60 s epochs: the plan is cut
        planner.times.begin_epoch(40, 10)
        clock.t += 60
        planner.end_epoch(epoch)
    assert planner.plan_changed and lines[-1].startswith("TIME PLAN: re-plan")


@pytest.mark.parametrize(
    "text,seconds", [("9h", 32400), ("45m", 2700), ("600s", 600), ("1h30m", 5400), ("90", 90), ("", None), (None, None)]
)
def test_parse_duration(project_modules, text, seconds):
    assert project_modules.planner.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["9 hours", "h", "-5m", "1x"])
def test_parse_duration_rejects(project_modules, text):
    with pytest.raises(ValueError, match="cannot read budget"):
        project_modules.planner.parse_duration(text)


def test_measured_epochs_faster_than_the_estimate_get_epochs_back(project_modules):
    """A pessimistic first estimate (slow first steps) cuts to 2 folds x 16 epochs; the measured
    epochs are 3x faster, so the next re-plan gives epochs back, up to the plan's 30, not past it."""
    plan = project_modules.planner
    planner, clock, lines = make(plan, budget=600)
    first_epoch(planner, clock, 0.25)
    assert (planner.folds, planner.epochs) == (2, 16), lines
    planner.times.begin_epoch(40, 10)
    clock.t += 4.0  # a measured epoch: 4 s, not the estimate's 11.7 s
    planner.end_epoch(2)
    assert planner.epochs > 16 and planner.epochs <= 30 and planner.folds == 2, lines
    assert lines[-1].startswith("TIME PLAN: measured 4.0s/epoch") and lines[-1].endswith("(given back)")
    given = planner.epochs
    for epoch in range(3, 6):  # more fast epochs: never past the configured 30, never another line
        planner.times.begin_epoch(40, 10)
        clock.t += 4.0
        planner.end_epoch(epoch)
    assert given <= planner.epochs <= 30
    # the rest of the plan fits 95% of the training time left
    at = planner.times.progress(planner.parallel)
    assert at.need(4.0, planner.folds, planner.epochs) <= 0.95 * planner.training_left()


def test_no_epochs_given_back_once_the_last_fold_has_ended(project_modules):
    plan = project_modules.planner
    planner, clock, lines = make(plan, budget=600, folds=1)
    first_epoch(planner, clock, 1.0)  # 1 fold, epochs cut to fit
    cut = planner.epochs
    assert cut < 30, lines
    planner.times.begin_epoch(40, 10)
    clock.t += 200  # a slow epoch that takes the fold past 20% of the budget...
    planner.end_epoch(2)
    before = list(lines)
    planner.end_fold(0, first=True)  # ...re-planned after the only fold has ended: nothing to give back
    assert planner.epochs <= cut and not any("given back" in x for x in lines[len(before) :]), lines


@pytest.mark.parametrize("workers,s_per_step", [(1, 0.07), (2, 0.14)])  # 2 workers: half the later folds each
def test_folds_cut_by_the_estimate_are_given_back_when_measured_epochs_leave_time(project_modules, workers, s_per_step):
    """Issue 29: the first estimate cuts 5 folds to 3 (epochs kept); measured epochs 3x faster
    give the folds back (each is a model and a fifth of the OOF rows), never past the plan's 5.
    Fold workers share the fold count (FoldQueue.cap): there the plan's folds stay."""
    plan = project_modules.planner
    planner, clock, lines = make(plan, budget=600)
    planner.parallel = workers
    first_epoch(planner, clock, s_per_step)
    assert (planner.folds, planner.epochs) == (3, 30), lines
    for epoch in range(2, 5):
        planner.times.begin_epoch(40, 10)
        clock.t += 1.0
        planner.end_epoch(epoch)
    if workers > 1:
        assert planner.folds == 3 and not any("given back" in x for x in lines), lines
        return
    assert planner.folds == 5 and planner.epochs == 30, lines
    assert [x for x in lines if "given back" in x] == [
        next(
            x
            for x in lines
            if x.startswith("TIME PLAN: measured 1.0s/epoch") and x.endswith("-> folds 3->5 (given back)")
        )
    ]
    at = planner.times.progress(planner.parallel)
    assert at.need(1.0, planner.folds, planner.epochs) <= 0.75 * planner.training_left()


def test_a_budget_too_small_for_one_epoch_is_said_once_at_the_first_estimate(project_modules):
    """Issue 30 (round two): `run.py --budget 20s` trained from a never-validated model with no word
    that the budget was too small. The first estimate says so, with the budget that fits one."""
    planner, clock, lines = make(project_modules.planner, budget=120)
    planner.times.begin_fold(0)
    planner.times.begin_epoch(400, 100)  # 0.5 s a step: ~3.9 min an epoch, far past the budget
    for i in range(planner.times.WARMUP_BATCHES + planner.times.MEASURE_BATCHES + 5):
        clock.t += 0.5
        planner.tick(i)
    said = [line for line in lines if "too small for one epoch" in line]
    assert len(said) == 1, lines
    assert said[0].startswith("TIME PLAN: the budget 2.0 min is too small for one epoch (~3.9 min/epoch, ")
    assert said[0].endswith("fits one") and "train.py's fallback or a checkpoint from inside the first epoch" in said[0]


def test_a_deadline_before_any_estimate_says_the_budget_is_too_small(project_modules):
    planner, clock, lines = make(project_modules.planner, budget=20)
    planner.times.begin_fold(0)
    planner.times.begin_epoch(40, 10)
    clock.t += 30.0  # the first (warm-up) step outlasts the budget
    assert planner.tick(0)
    assert lines == [
        "TIME PLAN: the budget 20s is too small for one epoch (the deadline came at step 1 of the first, before any "
        "estimate): the submission will be train.py's fallback or a checkpoint from inside the first epoch"
    ]


def test_time_left_out_of_an_epoch_is_not_its_cost(project_modules):
    """audio's export, timed once for the reserve inside the first epoch, is not an epoch's cost:
    the plan is not cut for it (the budget's clock still counts it)."""
    planner, clock, _ = make(project_modules.planner, budget=600, folds=5, epochs=10)
    planner.times.begin_fold(0)
    planner.times.begin_epoch(10, 2)
    clock.t += 10.0
    planner.times.leave_out(4.0)
    planner.end_epoch(1)
    planner.end_fold(0, False)
    assert planner.times.epoch_s == [6.0] and planner.times.fold_s == [6.0] and planner.elapsed() == 10.0


def test_the_folds_change_at_most_once_a_fold_after_the_first_plan(project_modules):
    """Issue 57, item 1: on a loaded 2-core machine a table's plan flipped folds 5->3->5->3->4->5->3
    (19 TIME PLAN lines in 60 s) as epoch times swung. After the first plan, a re-plan changes the
    folds at most once in a fold; within it a later re-plan cuts epochs only (the deadline guard
    still holds), and the next fold may change them again."""
    plan = project_modules.planner
    planner, clock, lines = make(plan, budget=600)
    first_epoch(planner, clock, 0.07)  # the first plan: 5 -> 3 folds (not a change of mind)
    assert planner.folds == 3, lines
    swings = [1.0, 1.0, 30.0, 1.0, 30.0, 1.0]  # fast, fast (folds back), slow, fast, slow, fast
    changes = []
    for epoch, epoch_s in enumerate(swings, start=2):
        before = planner.folds
        planner.times.begin_epoch(40, 10)
        clock.t += epoch_s
        planner.end_epoch(epoch)
        changes.append((before, planner.folds))
    in_fold_0 = [c for c in changes if c[0] != c[1]]
    assert in_fold_0 == [(3, 5)], lines  # given back once; the slow epochs after it cut epochs, not folds
    planner.times.begin_fold(1)
    planner.times.begin_epoch(40, 10)
    clock.t += 60.0  # a slow epoch in the next fold: now the folds may be cut
    planner.end_epoch(1)
    assert planner.folds < 5, lines


def test_epochs_are_given_back_at_most_once_a_fold_and_never_after_a_cut_in_it(project_modules):
    """Issue 57, item 1, the epochs' half: under a busy loop per core a table's MLP epochs took
    0.2-5 s, and fold 2 alone gave epochs back and cut them 6 times (21->38->19->18->21->50->48).
    A fold now gives epochs back once, and nothing back after a cut in it (the folds keep their
    own once-a-fold rule); a cut always may (the deadline's guard); the next fold may give back."""
    planner, clock, lines = make(project_modules.planner, budget=600, folds=3, epochs=60)
    first_epoch(planner, clock, 0.25)  # the first plan cuts the epochs (a folds-3 plan keeps its folds)
    assert planner.epochs < 60, lines
    for epoch, epoch_s in enumerate([1.0, 1.0, 40.0, *[1.0] * 4, 40.0, *[1.0] * 4], start=2):  # fast, slow, fast...
        planner.times.begin_epoch(40, 10)
        clock.t += epoch_s
        planner.end_epoch(epoch)
    in_fold_0 = [line for line in lines if line.startswith("TIME PLAN: ") and "estimate" not in line]
    assert sum("-> epochs" in line and "given back" in line for line in in_fold_0) == 1, lines
    cut = next(i for i, line in enumerate(in_fold_0) if line.startswith("TIME PLAN: re-plan at "))
    assert all("given back" not in line for line in in_fold_0[cut:]), lines  # none after the cut
    assert len(in_fold_0) <= 4, lines  # epochs back, folds back, then cuts only (the old planner: 7)
    planner.times.begin_fold(1)
    for epoch, epoch_s in enumerate([1.0, 1.0, 1.0, 1.0], start=1):  # fast again in the next fold
        planner.times.begin_epoch(40, 10)
        clock.t += epoch_s
        planner.end_epoch(epoch)
    assert lines[-1].endswith("(given back)"), lines


def test_ctrl_c_requests_the_stop_even_when_its_line_cannot_be_written(project_modules, monkeypatch):
    """The first Ctrl-C's handler asks for the stop before it writes its STOPPING line: a stdout pipe
    that is full or gone (OSError) loses the line, not the stop; a second Ctrl-C interrupts at once."""
    import builtins
    import signal

    plan, asked = project_modules.planner, []
    monkeypatch.setattr(signal, "getsignal", lambda sig: signal.default_int_handler)  # as in a fresh train.py
    handlers = {}
    monkeypatch.setattr(signal, "signal", lambda sig, handler: handlers.__setitem__(sig, handler))

    def no_stdout(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe")

    plan.install_stop_signals(asked.append)
    monkeypatch.setattr(builtins, "print", no_stdout)
    handlers[signal.SIGINT](signal.SIGINT, None)
    assert asked == ["SIGINT (Ctrl-C)"]
    assert handlers[signal.SIGINT] is signal.default_int_handler


EARLY_STOP = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # as run.py starts train.py
os.kill(os.getpid(), signal.SIGTERM)  # a container's stop while train.py imports
from machinery import planner
planner.keep_early_stops()  # runflags.begin's first step: the held stop arrives, and is kept
kept = list(planner.EARLY_STOPS)
os.kill(os.getpid(), signal.SIGTERM)  # a second one, before the planner exists: kept, not fatal
asked = []
planner.install_stop_signals(asked.append)  # the planner: the kept stop is asked for
print(kept, asked, signal.pthread_sigmask(signal.SIG_BLOCK, set()))
"""


def test_a_sigterm_held_while_train_py_imports_is_kept_for_the_planner(project_modules):
    """run.py starts train.py with SIGTERM blocked: a stop during its imports waits (it killed
    train.py before its fallback was written), `keep_early_stops` (train.py's first step) keeps it
    and lifts the hold, and the planner asks for the stop once it exists. In a process of its own:
    real signals and a real mask."""
    proj = Path(project_modules.planner.__file__).parents[1]
    r = subprocess.run([sys.executable, "-c", EARLY_STOP, str(proj)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "['SIGTERM'] ['SIGTERM'] set()", r.stdout


ASSIGNED = re.compile(r"^([^=#]*?)\s[-+*/]?=\s")  # an assignment statement's targets (not ==, not a keyword's =)


def planner_writes(template: Path, fields: set[str]) -> list[str]:
    """Each line of the template's modules and entry scripts (planner.py aside) that assigns one of
    `fields` on `planner`, `plan` or `run.planner`, as FILE:LINE."""
    field = re.compile(rf"\b(?:run\.planner|planner|plan)\.(?:{'|'.join(sorted(fields))})\b")
    writes = []
    for path in sorted(template.rglob("*.py*")):
        if path.name == "planner.py" or "__pycache__" in path.parts:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            left = ASSIGNED.match(line.strip())
            if left and field.search(left[1]):
                writes.append(f"{path.relative_to(template)}:{i}")
    return writes


def test_no_module_writes_the_planners_fields(project_modules):
    """Issue 58: the planner changes only through its own methods (`agreed`, `split_among`,
    `fold_back`, `grown_fold`, the training loop's hooks), so what changes the plan is found in
    planner.py. On the template before they were methods this found six writes: DDP's vote, the
    fold workers' shared cap and their count, growth's flag (twice) and a table's share of the time."""
    fields = set(vars(project_modules.planner.TimePlanner(60, 3, 5)))
    assert fields >= {"folds", "epochs", "parallel", "share", "growing", "stop_reason"}
    assert planner_writes(ROOT / "template", fields) == []


def test_a_measure_after_growth_chose_more_tta_views_prices_them(project_modules):
    """Growth chose 3 TTA views where the plan had 2 (tta_views.grow: set_view_factor(3 / 2)); a later
    validation pass, a grown seed's at the plan's 2 views, then prices predict.py's fold at 3 views,
    as a pass of 3 views would (the competition object's test_views is no longer rewritten for it)."""
    reserve = project_modules.planner.PredictionReserve
    grown, plan, three = reserve(600, 10.0), reserve(600, 10.0), reserve(600, 10.0)
    grown.set_view_factor(3 / 2)
    grown.set_view_factor(3 / 2)  # absolute: a fold worker sets the chosen factor before each grown unit
    for measured, views in ((grown, 2), (plan, 2), (three, 3)):
        measured.note_inference(2.0, 100, 1000, views, 0.001)
    assert grown.fold_s == pytest.approx(three.fold_s) and grown.fold_s > plan.fold_s * 1.4
