"""tune.py: optuna's search inside the budget, with real optuna, real trials of the generated
train.py on CPU, real worker processes on one journal file, a kill and a resume, and a real
PostgreSQL server when its binaries are installed (.ci/run installs them)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import free_port, render, run_script, start_until, stop_group
from kagtpl import table

TABULAR = {
    "task": "tabular",
    "gpu": "cpu",
    "id_col": "row_id",
    "folds": 3,
    "epochs": 8,
    "problem": "binary",
    "metric": "auc",
    "target": "target",
    "submission": "probs",
}
TRIAL = re.compile(r"^(?:\[tune\d\] )?TUNE: trial=(\d+) state=(\w+) value=(\S+) .*?params=(\{.*?\})", re.M)


def tabular_project(tmp_path, name="comp") -> Path:
    data = table.write_table(tmp_path / "data", "binary")
    return render(tmp_path / name, data_dir=str(data), **TABULAR)


def set_space(project: Path, body: str) -> None:
    """Edit tune.py's search space as a user does: a new search_space() replaces the rendered one."""
    path = project / "tune.py"
    text = path.read_text()
    new = f"def search_space(trial) -> dict:\n    return {body}\n\n\n"
    path.write_text(text.replace('if __name__ == "__main__":', new + 'if __name__ == "__main__":'))


def trials_of(log: str) -> list[tuple[int, str, str, dict]]:
    return [(int(n), state, value, json.loads(params)) for n, state, value, params in TRIAL.findall(log)]


def load_study(project: Path, name: str, url: str = ""):
    import optuna
    from optuna.storages.journal import JournalFileBackend

    storage = url or optuna.storages.JournalStorage(JournalFileBackend(str(project / "output/tune/optuna.journal")))
    return optuna.load_study(study_name=name, storage=storage)


# ----------------------------------------------------------------------------- fast: the rules


def test_pruner_is_hyperband_only_when_the_search_has_room_for_its_brackets(project_modules):
    tuning = project_modules.tuning
    # optuna's bracket count: floor(log_3(max_resource / 3)) + 1
    assert [tuning.hyperband_brackets(s) for s in (2, 3, 8, 9, 26, 27, 81)] == [0, 1, 1, 2, 2, 3, 4]

    def search(trials, epochs, pruner="auto"):
        return tuning.Search(
            Path("out"), "s", "", trials, None, 0.0, 1, epochs, "maximize", "Acc", pruner, 42, 1, 0, []
        )

    pruner, line = tuning.choose_pruner(search(30, 10))
    assert type(pruner).__name__ == "PatientPruner" and "HyperbandPruner(min_resource=3, max_resource=10" in line
    for trials, epochs in ((30, 8), (19, 10)):  # too few epochs for 2 brackets / too few trials for them
        pruner, line = tuning.choose_pruner(search(trials, epochs))
        assert type(pruner).__name__ == "MedianPruner", line
        assert "Hyperband needs >= 9 epochs per trial and >= 10 trials per bracket" in line
    assert type(tuning.choose_pruner(search(4, 3, "hyperband"))[0]).__name__ == "PatientPruner"
    assert type(tuning.choose_pruner(search(40, 30, "none"))[0]).__name__ == "NopPruner"


def test_auto_workers_follow_model_size_and_each_worker_gets_its_share_of_the_card(project_modules):
    workers, gpu = project_modules.workers, project_modules.gpu
    assert workers.auto_tune_workers("small", "cuda", 1, 24.0)[0] == 3
    assert workers.auto_tune_workers("small", "cuda", 2, 16.0)[0] == 4  # Kaggle T4x2: 2 per card
    assert workers.auto_tune_workers("large", "cuda", 1, 80.0)[0] == 1
    assert workers.auto_tune_workers("small", "cpu", 0, 0.0)[0] == 1
    env = [workers.tune_worker_env(i, 3, 2) for i in range(3)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in env] == ["0", "1", "0"]
    assert [e[gpu.SHARE_ENV] for e in env] == ["0.5000", "1.0000", "0.5000"]  # two on card 0, one on card 1
    total = 16 * gpu.GB
    cap, mine = gpu.share_of_card(total, 0.5)
    assert mine == 8 * gpu.GB and cap == pytest.approx((8 - gpu.CONTEXT_GB) / 16)  # both workers at their cap fit


def test_params_file_sets_defaults_and_a_flag_given_still_wins(project_modules, tmp_path):
    train, errors = project_modules.train, project_modules.errors
    path = tmp_path / "best_params.json"
    path.write_text(json.dumps({"params": {"lr": 0.0042, "hflip": False, "crop_scale": 0.4}, "trial": 3}))
    args = train.get_args(["--params", str(path), "--lr", "0.001"])
    assert (args.lr, args.hflip, args.crop_scale) == (0.001, False, 0.4)
    for params, says in (
        ({"nope": 1}, "'nope' is not a flag of"),
        ({"lr": "fast"}, "lr = 'fast' is not a valid --lr"),
        ({"hflip": 1}, "is not a valid --hflip"),
        ({"gpu": "a999"}, "is not a valid --gpu"),
    ):
        path.write_text(json.dumps({"params": params}))
        with pytest.raises(errors.RunError, match=re.escape(says)):
            train.get_args(["--params", str(path)])
    path.write_text("{not json")
    with pytest.raises(errors.RunError, match="cannot read it"):
        train.get_args(["--params", str(path)])
    # a dry run keeps its own folder when --params reads the flags again (the second parse had reset it)
    path.write_text(json.dumps({"params": {"lr": 0.0042}, "trial": 3}))
    args = train.get_args(["--params", str(path), "--dry-run"])
    assert args.lr == 0.0042 and Path(args.out_dir).name == "dry-run", args.out_dir


def test_a_search_whose_trials_keep_failing_stops(project_modules, tmp_path, capsys):
    """Failed trials do not count toward --trials, so failures must end a search on their own: 3
    with none complete, or GIVE_UP_IN_A_ROW in a row after some completed (this one looped)."""
    import optuna

    tuning = project_modules.tuning

    def broken_train(argv):
        raise SystemExit(f"{argv[0]}: every trial fails from here on")

    for completed, stops_after in ((0, tuning.GIVE_UP_AFTER), (2, tuning.GIVE_UP_IN_A_ROW)):
        search = tuning.Search(
            tmp_path / f"out{completed}", "s", "", 30, None, time.time(), 1, 4, "maximize", "Acc", "none", 0, 1, 0, []
        )
        storage = optuna.storages.InMemoryStorage()
        study = optuna.create_study(storage=storage, direction="maximize")
        for value in range(completed):
            study.add_trial(optuna.trial.create_trial(value=value, state=optuna.trial.TrialState.COMPLETE))
        assert tuning.work(study, storage, search, lambda trial: {"lr": 1e-3}, broken_train) == stops_after
        out = capsys.readouterr().out
        assert out.count("state=FAIL") == stops_after and "TUNE STOP: " in out, out
        assert ("in a row" in out) == (completed > 0), out


# ----------------------------------------------------------------------------- slow: real searches


@pytest.mark.slow
def test_tabular_search_prunes_a_bad_region_records_a_failure_and_run_py_trains_with_the_best(tmp_path):
    project = tabular_project(tmp_path)
    # a deliberately bad region (lr 1e-7 learns nothing in 8 epochs) and a broken value (--hidden x)
    set_space(
        project,
        '{"lr": trial.suggest_categorical("lr", [3e-3, 1e-7]), '
        '"hidden": trial.suggest_categorical("hidden", ["256,128", "256,128", "x"])}',
    )
    # --folds 4: a flag of the run signature, which run.py's --params auto must share with the search
    out = run_script(project, "tune.py", "--trials", "10", "--device", "cpu", "--budget", "10m", "--folds=4").stdout
    trials = trials_of(out)
    assert sum(state != "FAIL" for _, state, _, _ in trials) == 10, out  # failed trials do not count
    states = {state for _, state, _, _ in trials}
    bad = [t for t in trials if t[3]["lr"] == 1e-7 and t[3]["hidden"] != "x"]
    assert any(state == "PRUNED" for _, state, _, _ in bad), out  # pruning really happened
    assert all(state == "FAIL" for _, state, _, p in trials if p["hidden"] == "x"), out
    assert "FAIL" in states and "COMPLETE" in states, out
    assert re.search(r"state=FAIL .*error=ERROR: --hidden 'x'", out), out  # the trial's own error, one line
    assert re.search(r"^COMPLETE +\d+ ", out, re.M) and re.search(r"^PRUNED +\d+ ", out, re.M), out  # the table
    best = json.loads((project / "output/best_params.json").read_text())
    complete = [(float(v), n, p) for n, s, v, p in trials if s == "COMPLETE"]
    top = max(complete)[0]
    assert best["value"] == pytest.approx(top, abs=1e-5) and best["trial"] in [n for v, n, _ in complete if v == top]
    assert best["params"]["lr"] == 3e-3 and best["complete"], out
    assert len(best["signature"]) == len(best["params_signature"]) == 12  # the second without the files' times
    assert (project / "output/tune/history.png").stat().st_size > 0
    study = load_study(project, "comp")
    assert sorted(t.state.name for t in study.trials) == sorted(s for _, s, _, _ in trials)
    assert not list((project / "output/tune").glob("trial_*/*.pth"))  # trials' checkpoints freed

    # run.py picks the best parameters up, run as the last line says (it said plain `python run.py`,
    # whose 5 folds are another run signature: PARAMS: ... left out); the checkpoint's config says so
    line = r"^DONE: output/best_params.json; next: (.+)  \(or python (run\.py .*), which reads it\)$"
    done = re.search(line, out, re.M)
    assert done and done.group(1) == "python train.py --params output/best_params.json --folds 4", out[-2000:]
    run = run_script(project, *done.group(2).split(), "--device", "cpu", "--epochs", "2", "--models", "mlp").stdout
    assert "RUN: train.py --params" in run and f"trial {best['trial']}" in run, run
    config = json.loads((project / "output/config.json").read_text())
    config = config.get("config", config)
    assert (config["lr"], config["hidden"], config["folds"]) == (3e-3, "256,128", 4)
    assert (project / "output/submission.csv").exists()


@pytest.mark.slow
def test_image_search_prunes_frees_its_models_and_train_reads_best_params(tmp_path, digits_dir):
    import optuna
    from optuna.storages.journal import JournalFileBackend

    project = render(tmp_path / "img", data_dir=str(digits_dir), epochs=4)
    set_space(project, '{"lr": trial.suggest_float("lr", 1e-7, 1e-2, log=True)}')
    # the trials to run first, as a user enqueues known configurations: good, bad (lr 1e-7 learns nothing), ...
    (project / "output/tune").mkdir(parents=True)
    journal = optuna.storages.JournalStorage(JournalFileBackend(str(project / "output/tune/optuna.journal")))
    # the dog-breed layout submits probabilities: the search minimizes log loss, the competition's metric
    study = optuna.create_study(study_name="img", storage=journal, direction="minimize")
    for lr in (2e-3, 1e-7, 2e-3, 1e-7):
        study.enqueue_trial({"lr": lr})
    # in one process, as tune.py runs its trials: after it, no model or optimizer is left alive
    code = (
        "import gc, sys, torch, tune\n"
        "tune.main(['--trials', '4', '--device', 'cpu', '--pruner', 'median'])\n"
        "gc.collect()\n"
        "print('LIVE MODULES', sum(isinstance(o, torch.nn.Module) for o in gc.get_objects()))\n"
        "print('LIVE OPTIMIZERS', sum(isinstance(o, torch.optim.Optimizer) for o in gc.get_objects()))\n"
    )
    out = run_script(project, "-c", code, timeout=900).stdout
    trials = trials_of(out)
    assert [p["lr"] for *_, p in trials] == [2e-3, 1e-7, 2e-3, 1e-7], out
    assert any(s == "PRUNED" and p["lr"] == 1e-7 for _, s, _, p in trials), out
    assert "LIVE MODULES 0" in out and "LIVE OPTIMIZERS 0" in out, out
    best = json.loads((project / "output/best_params.json").read_text())
    assert best["params"] == {"lr": 2e-3}
    # what train.py reads from the file is the subject, not its training: one epoch of fold 0
    flags = ["--params", "output/best_params.json", "--folds", "2", "--train-folds", "1", "--epochs", "1"]
    train = run_script(project, "train.py", "--device", "cpu", *flags)
    assert "DONE" in train.stdout
    import torch

    ckpt = torch.load(project / "output/model_fold0.pth", weights_only=True)
    assert ckpt["config"]["params"] == "output/best_params.json"
    assert ckpt["config"]["lr"] != 1e-7 and ckpt["config"]["folds"] == 2


@pytest.mark.slow
def test_two_workers_share_one_journal_without_lock_errors(tmp_path):
    project = tabular_project(tmp_path)
    out = run_script(project, "tune.py", "--trials", "8", "--workers", "2", "--device", "cpu", "--study", "w2")
    log = out.stdout + out.stderr
    trials = trials_of(log)
    assert {line.split("]")[0] for line in log.splitlines() if " TUNE: trial=" in line} == {"[tune0", "[tune1"}, log
    assert 8 <= len(trials) <= 9 and len({n for n, *_ in trials}) == len(trials), log  # a running one may finish
    assert not re.search(r"locked|Traceback|state=FAIL", log, re.I), log
    study = load_study(project, "w2")
    assert len({t.user_attrs["pid"] for t in study.trials}) == 2  # two processes did the trials
    assert all(t.state.name in ("COMPLETE", "PRUNED") for t in study.trials)


@pytest.mark.slow
def test_a_worker_killed_mid_trial_counts_its_trial_out_and_the_other_finishes_the_search(tmp_path):
    """The OOM killer takes one of two workers mid-trial: its trial stayed RUNNING, counted toward
    --trials for good (the other worker stopped one trial short), and the summary said RUNNING.
    Now the other worker fails it before its next trial and runs the trials to --trials."""
    project = tabular_project(tmp_path)
    # 6 trials: the other worker stops only with 6 finished or running, never before it looks again
    cmd = ["tune.py", "--trials", "6", "--workers", "2", "--device", "cpu", "--study", "k"]
    cmd += ["--epochs", "60", "--patience", "60", "--pruner", "none"]
    proc, seen = start_until(project, cmd, "PRUNER: ")
    running, t_end = [], time.time() + 120
    while len({t.user_attrs.get("pid") for t in running}) < 2:  # each worker in its first trial
        assert time.time() < t_end and proc.poll() is None, "".join(seen)
        time.sleep(0.2)
        running = [t for t in load_study(project, "k").trials if t.state.name == "RUNNING" and "pid" in t.user_attrs]
    victim = running[0]
    os.kill(victim.user_attrs["pid"], signal.SIGKILL)
    rest, _ = proc.communicate(timeout=300)
    log = "".join(seen) + rest
    assert proc.returncode == 0 and "WARNING: tune workers exited [" in log and "-9" in log, log[-3000:]
    assert f"TUNE STALE: trial(s) [{victim.number}] RUNNING -> FAILED: their tune.py was killed" in log, log[-3000:]
    study = load_study(project, "k")
    states = sorted(t.state.name for t in study.trials)
    assert states == ["COMPLETE"] * 6 + ["FAIL"], (states, log[-3000:])  # --trials 6 finished, the killed one out
    assert study.trials[victim.number].user_attrs["error"] == "its tune.py was killed"


@pytest.mark.slow
def test_a_journal_lock_left_by_a_killed_search_is_released(project_modules, tmp_path):
    """A resumed search hung in CI (240 s, in create_study's journal append): the killed tune.py
    had held optuna's journal lock, a symlink to the journal, made with the relative path
    output/tune/optuna.journal, which resolves beside the link and dangles, so optuna's 30 s grace
    period (it reads the target's mtime) never ran. One process takes the lock through the
    project's storage and dies holding it; a search opened after it must get in."""
    project = Path(project_modules.tuning.__file__).resolve().parents[1]
    search = (
        "from pathlib import Path\n"
        "from machinery import tuning\n"
        "search = tuning.Search(Path('output'), 'comp', '', 4, None, 0.0, 1, 3, 'maximize', 'auc', 'none', 42, 1, 0,"
        " [])\n"
        "storage = tuning.open_storage(search.storage_url, search.folder)\n"
    )
    work = tmp_path / "work"
    (work / "machinery").mkdir(parents=True)
    for f in (project / "machinery").glob("*.py"):
        shutil.copy(f, work / "machinery" / f.name)
    killed = search + "import os\nstorage._backend._lock.acquire()\nos._exit(9)  # as SIGKILL: the lock stays\n"
    assert subprocess.run([sys.executable, "-c", killed], cwd=work, timeout=120).returncode == 9
    assert (work / "output/tune/optuna.journal.lock").is_symlink()
    # optuna's grace period, 30 s, made 3 s in this process alone (30 s of the suite's idle wait): the
    # mechanism is the same, and a lock that dangles never has a target to age, so it still hangs
    grace = "from optuna.storages.journal import JournalFileSymlinkLock as L\nL.__init__.__defaults__ = (3,)\n"
    opened = grace + search + "print('OPENED', tuning.open_study(search, storage).study_name)\n"
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", opened], cwd=work, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "OPENED comp" in r.stdout, r.stderr[-2000:]
    assert 3 <= time.time() - t0 < 60  # the grace period, then the stale lock is released


def test_a_journal_record_cut_mid_write_is_removed_and_the_study_goes_on(project_modules, tmp_path):
    """optuna reads past a journal's last record cut short (a full disk, a kill mid-write), but its
    next append glued a record onto it: a line that never parsed again, and every later tune.py
    died on it (JSONDecodeError in fail_stale_trials) instead of resuming."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    store, path = project_modules.study_storage, tmp_path / "optuna.journal"

    def storage():
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))

    study = optuna.create_study(study_name="s", storage=storage())
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    whole = path.read_bytes()
    assert store.mend_journal(path) == 0 and path.read_bytes() == whole  # a whole journal is left as it is
    path.write_bytes(whole[:-30])  # the last record (trial 1's end) cut mid-write
    assert store.mend_journal(path) == len(whole.splitlines(keepends=True)[-1]) - 30
    assert path.read_bytes().endswith(b"\n") and whole.startswith(path.read_bytes())
    again = optuna.load_study(study_name="s", storage=storage())
    again.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)  # appends after the whole records
    states = [t.state.name for t in optuna.load_study(study_name="s", storage=storage()).trials]
    assert states == ["COMPLETE", "RUNNING", "COMPLETE"]  # trial 1's end was the record cut: stale, as after a kill
    path.write_bytes(b'{"op_code":0,"worker_id"')  # nothing whole at all: an empty journal, a new study
    assert store.mend_journal(path) == 24 and path.read_bytes() == b""


@pytest.mark.slow
def test_a_killed_search_resumes_its_study(tmp_path):
    project = tabular_project(tmp_path)
    cmd = ["tune.py", "--trials", "6", "--device", "cpu", "--epochs", "30", "--patience", "30", "--pruner", "none"]
    proc, seen = start_until(project, cmd, "TUNE: trial=1 ")
    while not (project / "output/tune/trial_0002/train.log").exists():  # trial 2 has been asked for
        time.sleep(0.1)
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGKILL)  # no goodbye: trial 2 is left RUNNING in the journal
    proc.wait()
    assert load_study(project, "comp").trials[-1].state.name == "RUNNING"
    with open(project / "output/tune/optuna.journal", "ab") as f:  # ...and a record cut mid-write (a full disk)
        f.write(b'{"op_code":6,"worker_id":"w","trial_id":2,"state":1,"valu')
    try:
        out = run_script(project, *cmd, timeout=240).stdout
    except AssertionError as e:  # it hung once in CI (a 600 s timeout): the trials' logs say where the search was
        logs = {
            p.parent.name: p.read_text()[-1500:] for p in sorted((project / "output/tune").glob("trial_*/train.log"))
        }
        raise AssertionError(f"{e}\n{json.dumps(logs, indent=1)}") from None
    assert re.search(r"^TUNE RESUME: 3 trial\(s\) already in the study; stale RUNNING -> FAILED: \[2\]", out, re.M), out
    assert "optuna.journal: its last record was cut short (57 bytes: a kill or a full disk mid-write): removed" in out
    study = load_study(project, "comp")
    finished = [t.number for t in study.trials if t.state.name == "COMPLETE"]
    assert len(finished) == 6 and finished[:2] == [0, 1] and min(finished[2:]) == 3, out  # numbering goes on
    assert study.trials[2].state.name == "FAIL" and "killed" in study.trials[2].user_attrs["error"]
    assert (project / "output/best_params.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "reason"),
    [(signal.SIGTERM, "SIGTERM"), (signal.SIGHUP, "SIGHUP (the terminal closed)")],
    ids=["TERM", "HUP"],
)
def test_sigterm_stops_the_running_trial_and_the_search_exits_0_with_its_results(tmp_path, sig, reason):
    """A container's stop (SIGTERM to the whole process group), or a closed terminal (SIGHUP: the
    shell's to its job), ends the running trial with its save and starts no other."""
    project = tabular_project(tmp_path)
    cmd = ["tune.py", "--trials", "50", "--device", "cpu", "--epochs", "60", "--patience", "60", "--pruner", "none"]
    proc, seen = start_until(project, cmd, "TUNE: trial=1 ")
    log = project / "output/tune/trial_0002/train.log"
    while "Epoch 1:" not in (log.read_text() if log.exists() else ""):  # trial 2 is training (on any machine)
        time.sleep(0.1)
    if sig == signal.SIGTERM:
        out = stop_group(proc, seen)  # a container's stop reaches the whole process group
    else:
        os.killpg(proc.pid, sig)
        out = "".join(seen) + proc.communicate(timeout=120)[0]
    assert proc.returncode == 0, out
    assert re.search(rf"^TUNE: trial=2 state=PRUNED .* reason={re.escape(reason)}$", out, re.M), out
    assert re.search(rf"^TUNE STOP: {re.escape(reason)}", out, re.M) and "TUNE: trial=3 " not in out, out
    assert json.loads((project / "output/best_params.json").read_text())["trial"] in (0, 1)


@pytest.mark.slow
def test_the_deadline_stops_the_search_and_leaves_best_params(tmp_path):
    project = tabular_project(tmp_path)
    # 30 s, not 40 (tuning.FINISH_S keeps 10 s for the report): at 25 s beside a busy loop, 3 trials of ~4 s ran
    # and the deadline cut the 4th
    cmd = ["tune.py", "--trials", "500", "--budget", "30s", "--device", "cpu", "--epochs", "60", "--patience", "60"]
    t0 = time.time()
    out = run_script(project, *cmd).stdout
    took = time.time() - t0
    assert re.search(r"^TUNE STOP: (the budget is spent|the next trial would not fit)", out, re.M), out
    # a trial that train.py's deadline cut before its first epoch (tabular: "MODELS: cut mlp") is not a
    # failure: 10 of those in a row once ended a search as "10 trials in a row failed"
    assert "state=FAIL" not in out, out
    assert 0 < len(trials_of(out)) < 500
    assert took < 30 + 30, f"{took:.0f}s for a 30s budget\n{out}"  # startup and the report, not another trial
    best = json.loads((project / "output/best_params.json").read_text())
    assert set(best["params"]) == {"lr", "weight_decay", "dropout", "hidden"}


# ----------------------------------------------------------------------------- slow: a real PostgreSQL


def postgres_bin() -> Path | None:
    for folder in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (folder / "initdb").exists() and (folder / "pg_ctl").exists():
            return folder
    return None


@pytest.fixture()
def postgres():
    """A throwaway PostgreSQL server: initdb in a temp dir, pg_ctl start on a free port, stop at the end."""
    binaries = postgres_bin()
    if binaries is None:
        pytest.skip("PostgreSQL server binaries not installed (Debian: apt-get install postgresql; .ci/run does)")
    pytest.importorskip("psycopg", reason="psycopg[binary] (the dev extra) is SQLAlchemy's driver for postgresql://")
    as_user = []
    if os.geteuid() == 0:  # the server refuses to run as root: as Debian's postgres user
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: cannot start PostgreSQL as another user")
        as_user = ["runuser", "-u", "postgres", "--"]
    folder = Path(tempfile.mkdtemp(prefix="kagtpl-pg-"))  # pytest's tmp_path is private to root: /tmp is not
    if as_user:
        shutil.chown(folder, "postgres")
    data, port = folder / "data", free_port()

    def run(*cmd):
        return subprocess.run([*as_user, *cmd], cwd=folder, check=True, capture_output=True, text=True)

    run(str(binaries / "initdb"), "-D", str(data), "-U", "optuna", "--auth=trust")
    opts = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1"
    run(str(binaries / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(folder / "log"), "-w", "start")
    try:
        yield f"postgresql://optuna@127.0.0.1:{port}/postgres"
    finally:
        run(str(binaries / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_two_workers_share_a_study_on_a_real_postgresql_server(tmp_path, postgres):
    project = tabular_project(tmp_path)
    cmd = ["tune.py", "--trials", "6", "--workers", "2", "--device", "cpu", "--storage", postgres, "--study", "pg"]
    out = run_script(project, *cmd)
    log = out.stdout + out.stderr
    assert f"storage={postgres}" in log and not re.search(r"Traceback|state=FAIL", log), log
    study = load_study(project, "pg", postgres)
    assert sum(t.state.name in ("COMPLETE", "PRUNED") for t in study.trials) >= 6
    assert len({t.user_attrs["pid"] for t in study.trials}) == 2
    # a second machine joins by the same line: here, a second run adds to the same study
    run_script(project, "tune.py", "--trials", "8", "--device", "cpu", "--storage", postgres, "--study", "pg")
    assert sum(t.state.name in ("COMPLETE", "PRUNED") for t in load_study(project, "pg", postgres).trials) >= 8


@pytest.mark.slow  # runs tune.py (11 s): the fast tier runs no generated script
def test_a_bad_storage_url_is_one_error_line(tmp_path):
    project = tabular_project(tmp_path)
    out = run_script(
        project, "tune.py", "--storage", "postgresql://nobody@127.0.0.1:1/none", "--device", "cpu", check=False
    )
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("ERROR: --storage postgresql://nobody@127.0.0.1:1/none: cannot open it"), out.stderr
    assert not (project / "output").exists()  # nothing written
