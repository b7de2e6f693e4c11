"""The time budget, for real: run.py with a plan that needs many times the budget, SIGTERM,
and a run with no checkpoint at all. Subprocesses on CPU."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest
from test_run import assert_valid_submission

from conftest import RUN_ENV, epoch_at_least, render, run_script, start_until
from kagtpl import demo

pytestmark = pytest.mark.slow
CORES = len(os.sched_getaffinity(0))


def test_run_py_fits_a_plan_of_many_times_the_budget(tmp_path, digits_dir):
    # 5 folds x 300 epochs: on a quick day 5 x 30 was estimated at 79 s, under twice the 45 s budget
    # (2026-12-02, the full suite's demo test in 81 s against its usual 100-154 s); 5 x 100 then at
    # 95-128 s, and at 80 s in one full suite (2026-12-04, the demo's test 34 s); 300 epochs keep the
    # plan several times the budget on a machine three times as fast
    project = render(tmp_path / "proj", data_dir=str(digits_dir), folds=5, epochs=300)
    budget = 45
    t0 = time.time()
    r = subprocess.run(
        [sys.executable, "run.py", "--budget", f"{budget}s", "--device", "cpu"],
        cwd=project,
        env=RUN_ENV,
        capture_output=True,
        text=True,
        timeout=300,
    )
    wall = time.time() - t0
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    log = r.stdout
    assert wall <= budget, f"took {wall:.1f}s of a {budget}s budget\n{log[-2000:]}"
    # every unit planner.fmt_s prints: "9.5s", "75s", "2.0 min" (a slow machine's estimate may be any)
    estimate = re.search(r"^TIME ESTIMATE: .* = ([\d.]+) ?(min|s) for the whole plan", log, re.M)
    assert estimate, log[-3000:]
    needed = float(estimate.group(1)) * (60 if estimate.group(2) == "min" else 1)
    assert needed > 2 * budget  # the configured plan really needed several times the budget
    assert re.search(r"^TIME PLAN: estimate .* > 80% of .* training time left -> folds 5->\d", log, re.M), log
    assert re.search(
        r"^TIME: elapsed \S+ of 45s budget, remaining \S+ \(reserve \S+ for predict\), plan folds=\d+ "
        r"epochs=\d+",
        log,
        re.M,
    )
    m = re.search(r"^RUN: train ([\d.]+)s, predict ([\d.]+)s, total ([\d.]+)s = ([\d.]+) of the 45s budget$", log, re.M)
    assert m and float(m.group(4)) <= 1.0
    assert_valid_submission(project, digits_dir)
    # run.py told train.py that predict.py started beside it: the reserve leaves out predict.py's imports
    import torch

    checkpoint = next((project / "output").glob("model_fold*.pth"))
    assert torch.load(checkpoint, weights_only=True)["config"]["predict_beside"] is True


def test_sigterm_saves_and_exits_0_so_prediction_runs(tmp_path, digits_dir):
    project = render(tmp_path / "proj", data_dir=str(digits_dir), folds=3, epochs=30)
    proc, seen = start_until(project, ["train.py", "--device", "cpu"], epoch_at_least(2))
    proc.send_signal(signal.SIGTERM)  # what a container sends before it kills
    seen += proc.stdout.readlines()
    assert proc.wait(timeout=60) == 0, "".join(seen)
    log = "".join(seen)
    assert re.search(r"^STOPPED: SIGTERM; exiting 0 so predict.py runs", log, re.M), log
    assert (project / "output" / "model_fold0.pth").exists()
    assert "FOLD 1 (" not in log
    pred = run_script(project, "predict.py", "--device", "cpu").stdout
    assert "ENSEMBLE: 1 checkpoint(s), folds [0]" in pred
    assert_valid_submission(project, digits_dir)


def test_no_checkpoint_fails_loudly_and_writes_no_submission(tmp_path, digits_dir):
    project = render(tmp_path / "proj", data_dir=str(tmp_path / "missing-data"))
    r = run_script(project, "run.py", "--budget", "60s", "--device", "cpu", check=False)
    assert r.returncode == 1
    assert "PREFLIGHT ERROR" in r.stderr
    assert "RUN FAILED: predict.py exited 1 (its message is above); no submission was written" in r.stderr
    assert not (project / "output" / "submission.csv").exists()


def test_on_kaggle_without_budget_uses_9h(tmp_path, digits_dir):
    project = render(tmp_path / "proj", data_dir=str(digits_dir))
    env = {**RUN_ENV, "KAGGLE_KERNEL_RUN_TYPE": "Interactive"}
    args = ["--dry-run", "--device", "cpu", "--data-dir", str(digits_dir), "--out-dir", str(tmp_path / "working")]
    r = run_script(project, "train.py", *args, "--budget", "", env=env, timeout=300)  # through the fork server
    assert "TIME: on Kaggle with no --budget: using 9h, the code-competition limit" in r.stdout
    assert re.search(r"^TIME: elapsed \S+ of 540.0 min budget", r.stdout, re.M)
    assert os.path.exists(tmp_path / "working" / "model_fold0.pth")
    # the last line's command reads the folders this run used, not Kaggle's defaults: run as written,
    # it hands in (it said plain `python predict.py`: /kaggle/input/<slug>, which is not there)
    done = re.fullmatch(r"DONE: 2 folds in [\d.]+s; next: python (predict\.py .*)", r.stdout.splitlines()[-1])
    working = str(tmp_path / "working")
    assert done and shlex.split(done.group(1))[1:] == ["--data-dir", str(digits_dir), "--out-dir", working]
    run_script(project, *shlex.split(done.group(1)), "--device", "cpu", env=env)
    assert_valid_submission(project, digits_dir, working)


@pytest.fixture()
def slowed_machine():
    """A CPU-bound process on every core beside the run: everything runs slower than anything the
    run measured before they started. The other pytest workers are some of them: an `alone` test
    has the light tests beside it (conftest._lock_mode), one process at a time a worker, so busy loops
    take only the cores left (on 2 cores under -n auto, one loop and the other worker's light tests;
    two loops under -n 0). Two loops and the other worker waiting had cost the suite ~75 s of a
    core idle (2026-11-29)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(1, CORES - workers + 1))]
    yield
    for hog in hogs:
        hog.kill()
        hog.wait()


def run_in_budget(project, budget: int, *args):
    """run.py under `budget` seconds, timed from outside; returns (result, wall seconds)."""
    t0 = time.time()
    r = subprocess.run(
        [sys.executable, "run.py", "--budget", f"{budget}s", "--device", "cpu", *args],
        cwd=project,
        env=RUN_ENV,
        capture_output=True,
        text=True,
        timeout=budget + 120,
    )
    return r, time.time() - t0


@pytest.mark.alone
def test_a_large_model_on_a_slowed_machine_with_a_test_set_ten_times_larger_ends_inside_the_budget(
    tmp_path, slowed_machine
):
    """Issue 29, item 9: a 23M-parameter model, a CPU hog, and 400 test images (the 40 of the
    other tests x 10): the plan cannot be measured right, and predict.py must fit on its own."""
    data = demo.write_digits(tmp_path / "data", n_train=240, n_test=400)
    project = render(tmp_path / "proj", data_dir=str(data), folds=5, epochs=30, model="resnet50", image_size=64)
    budget = 60
    r, wall = run_in_budget(project, budget, "--no-pretrained")
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    assert wall <= budget + 1, f"took {wall:.1f}s of a {budget}s budget\n{log[-3000:]}"
    m = re.search(r"^RUN: train [\d.]+s, predict [\d.]+s, total [\d.]+s = ([\d.]+) of the 60s budget$", log, re.M)
    assert m and float(m.group(1)) <= 1.0, log[-3000:]
    assert "SUBMISSION: output/submission.csv is a fallback (class priors for every row)" in log
    # predict.py either made it with the folds there was time for, or kept the fallback and said so,
    # or (its start slowed by the hogs past the deadline) run.py stopped it and said which file stays
    made = re.search(r"^SUBMISSION: output/submission.csv \(400 rows, \d fold\(s\) ensembled\)$", log, re.M)
    kept = "SUBMISSION: output/submission.csv kept: no fold finished before the deadline" in log
    # a checkpoint from inside the first epoch was never validated: no evidence it beats the fallback
    unvalidated = "SUBMISSION: output/submission.csv kept: no checkpoint was validated" in log
    stopped = "RUN: predict.py stopped at the budget: output/submission.csv is the last submission this run wrote"
    assert made or kept or unvalidated or stopped in log, log[-3000:]
    assert "killed" not in log
    assert_valid_submission(project, data)


@pytest.mark.alone
def test_a_budget_too_small_for_one_epoch_still_ends_inside_it_with_a_valid_submission(tmp_path, slowed_machine):
    """No fold can finish well: train.py stops inside its first epoch (or run.py stops it), and
    predict.py has a checkpoint of an unfinished epoch or none, and seconds. Whichever way it
    goes on this machine, the run ends inside the budget, with the fallback written after
    preflight or something better, and its last lines say which."""
    data = demo.write_digits(tmp_path / "data", n_train=240, n_test=400)
    project = render(tmp_path / "proj", data_dir=str(data), folds=5, epochs=30, model="resnet50", image_size=64)
    budget = 40  # preflight (imports, caches) took 8-10 s here under the hogs: 3x slower still leaves room
    r, wall = run_in_budget(project, budget, "--no-pretrained")
    log = r.stdout + r.stderr
    assert wall <= budget + 1, f"took {wall:.1f}s of a {budget}s budget\n{log[-3000:]}"
    assert "SUBMISSION: output/submission.csv is a fallback (class priors for every row)" in log, log[-3000:]
    kept = ("no fold finished before the deadline", "no checkpoint was validated", "train.py saved no model")
    ends = (
        r"^SUBMISSION: output/submission.csv \(400 rows, \d fold\(s\) ensembled\)$",
        rf"^SUBMISSION: output/submission.csv kept: ({'|'.join(kept)})",
        r"^RUN: predict.py stopped at the budget: output/submission.csv is the last submission this run wrote$",
    )
    found = [bool(re.search(end, log, re.M)) for end in ends]
    # predict.py's own last word is one of two; run.py's "stopped at the budget" may follow either
    # (under the CPU hogs, predict.py's exit after its line can outlast the budget's last second).
    # No checkpoint at all is no failure: predict.py keeps the fallback (it said "run train.py first")
    assert any(found) and found[:2].count(True) <= 1, log[-3000:]
    assert "RUN FAILED: predict.py" not in r.stderr, log[-3000:]
    assert r.returncode == (1 if "RUN FAILED: train.py" in r.stderr else 0), log[-3000:]  # killed past its grace
    sub = assert_valid_submission(project, data)
    if not re.search(ends[0], log, re.M):  # the fallback: every row the training class frequencies
        priors = sub[sub.columns[1:]].to_numpy()
        assert (priors == priors[0]).all() and abs(priors[0].max() - 0.1) < 0.03


def test_a_slow_predict_start_still_hands_in_the_trained_folds(tmp_path, digits_dir):
    """Issue 46, item 3: on an H100 a segmentation run.py --budget 90s trained 3 folds, then
    predict.py's start (interpreter, imports, CUDA: 15-23 s) outlasted its 14 s reserve and the
    fallback was handed in. Here predict.py's start is slowed by 12 s (a sitecustomize that sleeps
    in predict.py alone), more than the reserve once predict.py is ready: run.py starts predict.py
    beside train.py, so the slow start is paid while train.py trains, and the submission comes
    from the trained folds, inside the budget. Until predict.py says its imports are paid, the
    reserve holds its whole start: in CI (2 cores, another test beside) predict.py at nice 10 was
    not ready 39 s into the run, train.py had trained on to 29 s of the 40, and the fallback was
    handed in beside a trained fold."""
    project = render(tmp_path / "proj", data_dir=str(digits_dir), folds=3, epochs=30)
    slow, tmp = tmp_path / "slow", tmp_path / "tmp"
    slow.mkdir()
    tmp.mkdir()
    (slow / "sitecustomize.py").write_text(
        "import sys, time\nif sys.argv and sys.argv[0].endswith('predict.py'):\n    time.sleep(12)\n"
    )
    budget = 40
    t0 = time.time()
    r = subprocess.run(
        [sys.executable, "run.py", "--budget", f"{budget}s", "--device", "cpu"],
        cwd=project,
        env={**RUN_ENV, "PYTHONPATH": str(slow), "TMPDIR": str(tmp)},
        capture_output=True,
        text=True,
        timeout=budget + 120,
    )
    wall, log = time.time() - t0, r.stdout + r.stderr
    assert r.returncode == 0, log[-4000:]
    assert wall <= budget + 1, f"took {wall:.1f}s of a {budget}s budget\n{log[-3000:]}"
    started = re.search(r"^PREDICT: started beside train.py: ready in ([\d.]+)s, then waited ([\d.]+)s", log, re.M)
    assert started and float(started.group(1)) >= 12, log[-3000:]
    assert re.search(r"^SUBMISSION: output/submission.csv \(40 rows, [1-3] fold\(s\) ensembled\)$", log, re.M), log[
        -3000:
    ]
    assert "kept: no fold finished" not in log
    assert_valid_submission(project, digits_dir)
    # the reserve: predict.py's whole start until it said it was ready (12 s of sleep, then its imports),
    # then only what train.py did after its own imports: less than the slow start, which still was paid
    ready = re.search(r"^RESERVE: predict.py is ready beside train.py ", log, re.M)
    reserves = [
        (m.start(), float(m.group(1))) for m in re.finditer(r"^TIME: .*\(reserve ([\d.]+)s for predict\)", log, re.M)
    ]
    before = [s for at, s in reserves if not ready or at < ready.start()]
    after = [s for at, s in reserves if ready and at > ready.start()]
    print(f"reserve {before} before predict.py was ready, {after} after; ready line: {bool(ready)}")
    assert before and (not after or max(after) < min(before)), log[-3000:]
    if after:
        assert max(after) < 12, log[-3000:]  # the slow start alone is over the reserve held once it was ready
    assert not list(tmp.glob("kagtpl-run-*")), "run.py left its ready file's folder behind"
