"""Issue 56: a stop never costs the submission. run.py and its two children (train.py, and
predict.py started beside it) under each way a run ends: a container's stop (SIGTERM to the
whole process group), SIGKILL or SIGTERM or Ctrl-C to run.py alone, predict.py killed by the OOM
killer, a second run on a folder a train.py holds, a train.py hung past the safety net. Each
ends with the trained folds handed in (or says in its last line exactly what was handed in),
and nothing of the run left running. One rendered project, each test in an output folder of
its own; real processes on CPU."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_run import assert_valid_submission

from conftest import RUN_ENV, epoch_at_least, forkpython, launch, render, run_script

HANDED_FOLDS = "RUN: handed in {out}/submission.csv, predict.py's ensemble of the checkpoints"


@pytest.fixture(scope="module")
def project(tmp_path_factory, digits_dir):
    return render(tmp_path_factory.mktemp("stops") / "proj", data_dir=str(digits_dir), folds=3, epochs=30)


def start_run(project: Path, out: Path, *args: str, env: dict | None = None):
    """run.py in a session of its own (a container's process group), its lines merged on a pipe;
    through the fork server (conftest.launch), its train.py and predict.py forked warm from it."""
    args = ["run.py", "--device", "cpu", f"--out-dir={out}", *args]
    return launch(project, args, env or RUN_ENV, subprocess.STDOUT, new_session=True)


def read_until(proc: subprocess.Popen, pattern, seen: list) -> list:
    """Lines until one matches `pattern` (a regex) or `pattern(line)` is true (conftest.epoch_at_least)."""
    found = pattern if callable(pattern) else lambda line: re.search(pattern, line)
    for line in proc.stdout:
        seen.append(line)
        if found(line):
            return seen
    wanted = pattern if isinstance(pattern, str) else "the line awaited"
    raise AssertionError(f"never printed {wanted}\n" + "".join(seen)[-3000:])


def rest(proc: subprocess.Popen, seen: list, timeout: float = 120) -> str:
    """Every line to the end of the pipe: the end of the last process that holds it (run.py,
    or predict.py when it outlives run.py)."""
    t_end = time.time() + timeout
    for line in proc.stdout:
        seen.append(line)
        assert time.time() < t_end, "".join(seen)[-3000:]
    return "".join(seen)


def children_of(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in found]


def script_pid(parent: int, name: str, timeout: float = 30) -> int:
    t_end = time.time() + timeout
    while time.time() < t_end:
        for pid in children_of(parent):
            try:
                if name in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                    return pid
            except OSError:
                continue
        time.sleep(0.1)
    raise AssertionError(f"no {name} under pid {parent}")


def nothing_left(out: Path) -> None:
    """No process of this run is alive: none names its output folder on its command line."""
    t_end = time.time() + 10
    while time.time() < t_end:
        ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
        left = [line for line in ps.splitlines() if str(out) in line]
        if not left:
            return
        time.sleep(0.2)
    raise AssertionError("still running:\n" + "\n".join(left))


def from_folds(project: Path, out: Path, digits_dir: Path) -> None:
    """The submission is the folds' (every row its own probabilities), not the class prior."""
    sub = assert_valid_submission(project, digits_dir, str(out))
    probs = sub[sub.columns[1:]].to_numpy()
    assert not (probs == probs[0]).all(), "the fallback (one prior for every row) was handed in"


@pytest.mark.slow
@pytest.mark.parametrize("reader", ["kept", "gone"])
def test_a_container_stop_hands_in_the_trained_folds(project, digits_dir, tmp_path, reader):
    """Case 1: SIGTERM to every process of the group (`timeout`, a container's stop): train.py
    saves fold 0, and run.py and predict.py live on to hand it in. With the reader gone first (a
    notebook's kernel stopped: the cell that streamed run.py's lines is gone with it), every
    script's console is /dev/null from its first lost write, and what was handed in is read from
    run.log and predict.log, as the lines would have said it."""
    out = tmp_path / "out"
    proc = start_run(project, out, "--budget", "60s")
    seen = read_until(proc, epoch_at_least(2), [])
    if reader == "gone":
        proc.stdout.close()  # the next write of run.py, train.py or predict.py to it fails with EPIPE
    os.killpg(proc.pid, signal.SIGTERM)
    log = rest(proc, seen) if reader == "kept" else ""
    code = proc.wait(timeout=120)
    if reader == "gone":  # the files hold each script's lines: train.py's, then predict.py's, then run.py's
        log = "".join((out / name).read_text() for name in ("train.log", "predict.log", "run.log"))
    assert code == 0 and "Traceback" not in log, log[-3000:]
    assert "RUN: SIGTERM: training ends (save and exit), then predict.py hands in the checkpoints" in log
    assert re.search(r"^STOPPED: SIGTERM; exiting 0 so predict.py runs", log, re.M), log[-3000:]
    assert re.search(r"^SUBMISSION: \S+ \(40 rows, 1 fold\(s\) ensembled\)$", log, re.M), log[-3000:]
    assert log.rstrip().splitlines()[-1].startswith(HANDED_FOLDS.format(out=out)), log[-2000:]
    from_folds(project, out, digits_dir)
    nothing_left(out)


ORPHAN_LINE = "PREDICT: run.py ended before train.py did: waiting for train.py to save, then predicting on its own\n"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_run_py_stopped_alone_leaves_no_orphan_and_hands_in_the_folds(project, digits_dir, tmp_path, sig):
    """Case 2 and 6: a signal to run.py alone. Before, train.py trained on as an orphan (parent
    pid 1), Ctrl-C was a traceback, and the fallback stayed. SIGKILL: train.py gets SIGTERM with
    run.py's death (a parent-death signal) and saves; predict.py, whose stdin ends without `go`,
    waits for it and hands in the folds. SIGTERM and Ctrl-C: run.py ends training and hands in."""
    out = tmp_path / "out"
    proc = start_run(project, out, "--budget", "60s")
    seen = read_until(proc, epoch_at_least(2), [])
    os.kill(proc.pid, sig)
    log = rest(proc, seen)
    code = proc.wait(timeout=60)
    assert "Traceback" not in log, log[-3000:]
    assert re.search(r"^STOPPED: SIGTERM; exiting 0 so predict.py runs", log, re.M), log[-3000:]
    assert "FOLD 1 (" not in log  # nothing trained on past the stop
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
        assert "PREDICT: run.py ended before train.py did: waiting for train.py to save" in log, log[-3000:]
        # ...and predict.log has it first, though it was said before predict.py held the folder
        kept = (out / "predict.log").read_text()
        assert kept.startswith(ORPHAN_LINE) and kept.count(ORPHAN_LINE) == 1, kept
        # the console's once: its text, not its newline (PYTHONUNBUFFERED writes print's end apart, and
        # train.py's lines on the same pipe may come between)
        assert log.count(ORPHAN_LINE.rstrip("\n")) == 1, log[-3000:]
    else:
        assert code == 0, log[-3000:]
        assert log.rstrip().splitlines()[-1].startswith(HANDED_FOLDS.format(out=out)), log[-2000:]
    assert re.search(r"^SUBMISSION: \S+ \(40 rows, 1 fold\(s\) ensembled\)$", log, re.M), log[-3000:]
    from_folds(project, out, digits_dir)
    nothing_left(out)


def on_a_terminal(project: Path, argv: list[str]) -> tuple[subprocess.Popen, int]:
    """`argv` on a pseudo-terminal that is its session's controlling terminal, as a command typed
    over SSH (a new interpreter: the fork server's pipes are no terminal). Returns the process and
    the terminal's master end, whose close is the connection's drop."""
    try:
        master, slave = os.openpty()
    except OSError as e:  # a container without /dev/ptmx
        pytest.skip(f"no pseudo-terminal here: {e}")

    def take_the_terminal():  # after setsid (start_new_session): the slave becomes the controlling terminal
        import fcntl
        import termios

        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a login shell's command has it, under a `nohup pytest` too

    try:
        proc = subprocess.Popen(
            argv,
            cwd=project,
            env=RUN_ENV,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            preexec_fn=take_the_terminal,
        )
    finally:
        os.close(slave)
    return proc, master


def read_terminal(master: int, found, timeout: float = 120) -> str:
    """The terminal's output until a line for which `found(line)` is true."""
    text, t_end = "", time.time() + timeout
    while time.time() < t_end:
        try:
            chunk = os.read(master, 4096).decode(errors="replace")
        except OSError:  # EIO: every process holding the terminal has ended
            chunk = ""
        if not chunk:
            break
        text += chunk.replace("\r\n", "\n").replace("\r", "\n").replace("\x1b[K", "")  # a progress line's returns
        if any(found(line) for line in text.splitlines()):
            return text
    raise AssertionError(f"the terminal never showed the line awaited:\n{text[-3000:]}")


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run.py", "train.py", "nohup train.py"])
def test_a_closed_terminal_is_a_stop_that_hands_in_the_trained_folds(project, digits_dir, tmp_path, command):
    """An SSH connection dropped under a run typed at its prompt: the kernel sends SIGHUP to the
    session's leader, the shell to its job's process group, and every write to the terminal fails
    (EIO). Before, SIGHUP's default ended run.py and predict.py where they stood and train.py died
    of its next print (OSError 5): the training prior was handed in beside three trained boosters
    and two MLP folds. Now a hangup is a stop: train.py saves and ends, predict.py hands in the
    folds, and the lines go on in train.log, run.log and predict.log. Under nohup (SIGHUP ignored) the
    run goes on to its end."""
    out, *nohup = tmp_path / "out", *command.split()[:-1]
    script = command.split()[-1]
    plan = ["--budget", "60s"] if script == "run.py" else ["--epochs", "2"] if nohup else []
    argv = [*nohup, sys.executable, script, "--device", "cpu", f"--out-dir={out}", *plan]
    proc, master = on_a_terminal(project, argv)
    try:
        if nohup:  # its lines go to nohup.out; it ignores SIGHUP once it runs python, not before
            seen = read_terminal(master, lambda line: "nohup: " in line)
            log, t_end = out / "train.log", time.time() + 120
            while not (log.exists() and "Epoch 1: " in log.read_text()) and time.time() < t_end:
                time.sleep(0.1)
        else:
            seen = read_terminal(master, epoch_at_least(2))
    finally:
        os.close(master)  # the connection drops: SIGHUP to the session's leader
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGHUP)  # the shell's SIGHUP to its job
    code = proc.wait(timeout=120)
    (project / "nohup.out").unlink(missing_ok=True)
    log = (out / "train.log").read_text()
    assert code == 0 and "Traceback" not in log, seen[-2000:] + log[-3000:]
    if nohup:
        assert "STOPPED" not in log and re.search(r"^DONE: 3 folds", log, re.M), log[-3000:]  # 2 epochs each
    else:  # run.py's train.py is stopped by run.py (SIGTERM); one typed alone, by the hangup itself
        stopped = "SIGTERM" if script == "run.py" else "SIGHUP (the terminal closed)"
        assert re.search(rf"^STOPPED: {re.escape(stopped)}; exiting 0 so predict.py runs", log, re.M), log[-3000:]
        assert "FOLD 1 (" not in log  # nothing trained on past the stop
    if script == "run.py":
        from_folds(project, out, digits_dir)  # predict.py, in run.py's group, lived on to hand them in
        # what was handed in, which the closed terminal never showed: run.log and predict.log keep it
        said = (out / "run.log").read_text()
        assert "RUN: SIGHUP (the terminal closed): training ends (save and exit)" in said, said
        assert f"RUN: handed in {out / 'submission.csv'}, predict.py's ensemble" in said, said
        assert f"SUBMISSION: {out / 'submission.csv'}" in (out / "predict.log").read_text()
    nothing_left(out)


@pytest.mark.slow
def test_run_py_killed_before_the_first_checkpoint_leaves_the_fallback_without_an_error(project, digits_dir, tmp_path):
    """Case 2 before any fold: SIGKILL to run.py while train.py reads its data. train.py (SIGTERM with
    run.py's death) writes its fallback and saves no model; predict.py, on its own (its stdin ended
    without `go`), keeps that fallback with its one line and exits 0. It said `ERROR: no loadable
    model_fold*.pth in output: run train.py first (nothing was written)` and exited 1: the fallback
    stayed, but the line sent you to run train.py, which had run and written it."""
    out = tmp_path / "out"
    proc = start_run(project, out, "--budget", "60s")
    seen = read_until(proc, r"^BATCH: ", [])  # train.py's start lines: its data is read next
    os.kill(proc.pid, signal.SIGKILL)
    log = rest(proc, seen)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert "PREDICT: run.py ended before train.py did: waiting for train.py to save" in log, log[-3000:]
    assert (out / "predict.log").read_text().startswith(ORPHAN_LINE)  # what it kept, and why, in its log too
    assert re.search(r"^STOPPED: SIGTERM; exiting 0 so predict.py runs", log, re.M), log[-3000:]
    assert "ERROR" not in log and "first (nothing was written)" not in log, log[-3000:]
    kept = f"SUBMISSION: {out}/submission.csv kept: train.py saved no model in this run, so its fallback is handed in"
    assert log.rstrip().splitlines()[-1].startswith(kept), log[-2000:]
    sub = assert_valid_submission(project, digits_dir, str(out))
    probs = sub[sub.columns[1:]].to_numpy()
    assert (probs == probs[0]).all(), "not the fallback (one prior for every row)"
    nothing_left(out)


def sigterm_held(pid: int) -> bool:
    """Whether SIGTERM is blocked in `pid` (its SigBlk mask): run.py's hold on a train.py still importing."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("how", ["container stop", "run.py killed"])
def test_a_stop_while_train_py_imports_hands_in_the_fallback(project, digits_dir, tmp_path, how):
    """A stop in a run's first seconds, while train.py imports: new interpreters here, as on a
    machine (3-4 s of imports; the fork server's warm start has none). run.py starts train.py with
    SIGTERM blocked; its first step takes the held signal as a stop, so it writes its fallback
    and ends, and the fallback is handed in. Before, SIGTERM (a container's stop, or run.py's
    death) killed train.py in its imports: `RUN: handed in no submission`, exit 1."""
    out = tmp_path / "out"
    args = [sys.executable, "run.py", "--device", "cpu", f"--out-dir={out}", "--budget", "60s"]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    proc = subprocess.Popen(args, cwd=project, env=RUN_ENV, start_new_session=True, **pipes)
    train = script_pid(proc.pid, "train.py")
    held = sigterm_held(train)  # read before the stop: still importing (its first step lifts the hold)
    if how == "container stop":  # SIGTERM to every process: run.py's group and train.py's own
        os.killpg(proc.pid, signal.SIGTERM)
        os.kill(train, signal.SIGTERM)
    else:  # train.py gets SIGTERM with run.py's death (its parent-death signal)
        os.kill(proc.pid, signal.SIGKILL)
    log = rest(proc, [])
    code = proc.wait(timeout=60)
    assert "FOLD 0" not in log and "Traceback" not in log, log[-3000:]
    assert re.search(r"^SUBMISSION: \S+ is a fallback \(class priors for every row\)", log, re.M), log[-3000:]
    assert re.search(r"^STOPPED: SIGTERM; exiting 0 so predict.py runs", log, re.M), log[-3000:]
    kept = f"SUBMISSION: {out}/submission.csv kept: train.py saved no model in this run, so its fallback is handed in"
    assert kept in log, log[-3000:]
    if how == "container stop":
        assert code == 0, log[-3000:]
        assert log.rstrip().splitlines()[-1].startswith(f"RUN: handed in {out}/submission.csv, this run's fallback")
    else:
        assert code == -signal.SIGKILL
    sub = assert_valid_submission(project, digits_dir, str(out))
    probs = sub[sub.columns[1:]].to_numpy()
    assert (probs == probs[0]).all(), "not the fallback (one prior for every row)"
    nothing_left(out)
    assert held, "the stop came after train.py's imports: this test did not stop it where it means to"


@pytest.mark.slow
def test_predict_py_killed_while_it_waits_is_started_again(project, digits_dir, tmp_path):
    """Case 3: predict.py killed (kill -9, the OOM killer) while it waits for `go`. Before, run.py
    said "predict.py stopped at the budget" and exited 0 with the fallback. Now it is started
    again at once, beside train.py, so its imports are paid while train.py trains (started again
    only after training, under CI's load it missed the budget: the reserve train.py kept leaves
    out predict.py's imports), and when that one dies too the run ends 1 saying the fallback
    stayed and why."""
    out = tmp_path / "out"
    # a plan of 3 epochs, as below: the project's 30 were cut to fill the 40 s (12 s more of the suite), and
    # the restart comes at fold 0 either way, beside the 3 folds x 3 epochs still to train
    proc = start_run(project, out, "--budget", "40s", "--epochs", "3", "--no-grow")
    seen = read_until(proc, r"^FOLD 0 \(", [])
    os.kill(script_pid(proc.pid, "predict.py"), signal.SIGKILL)
    log = rest(proc, seen)
    assert proc.wait(timeout=60) == 0, log[-3000:]
    assert "RUN: predict.py died (SIGKILL) while train.py trains: started again beside it\n" in log, log[-3000:]
    assert re.search(r"^PREDICT: started beside train.py: ready in", log, re.M), log[-3000:]
    assert "stopped at the budget" not in log
    assert log.rstrip().splitlines()[-1].startswith(HANDED_FOLDS.format(out=out)), log[-2000:]
    from_folds(project, out, digits_dir)

    out2 = tmp_path / "out2"  # the one started again dies too: exit 1, one line on what stayed
    # fold 0 alone (--train-folds 1): both deaths come in its first epoch; the folds after it were 12 s of the
    # test (30.5 s alone, now 18.8 s)
    proc = start_run(project, out2, "--budget", "40s", "--epochs", "3", "--no-grow", "--train-folds", "1")
    seen = read_until(proc, r"^FOLD 0 \(", [])
    os.kill(script_pid(proc.pid, "predict.py"), signal.SIGKILL)
    read_until(proc, r"^RUN: predict.py died", seen)
    os.kill(script_pid(proc.pid, "predict.py"), signal.SIGKILL)
    log = rest(proc, seen)
    assert proc.wait(timeout=60) == 1, log[-3000:]
    assert log.rstrip().splitlines()[-1] == (
        f"RUN FAILED: predict.py died (SIGKILL); {out2}/submission.csv is this run's fallback (the training prior)"
    ), log[-2000:]
    assert f"RUN: handed in {out2}/submission.csv, this run's fallback (the training prior): predict.py died" in log
    nothing_left(out2)


def test_a_predict_py_started_again_beside_train_has_its_imports_to_pay_again(project_modules, tmp_path):
    """run.py names a file predict.py touches once its imports are paid (reserve.READY_ENV), and
    train.py's reserve leaves them out from then on. A predict.py started beside train.py, the
    first or one started again after the OOM killer took it, finds that file gone: train.py's
    reserve holds its whole start again until this one says its imports are paid."""
    run = project_modules.run
    ready = tmp_path / "predict-ready"
    ready.touch()  # an earlier predict.py's word
    waits = [sys.executable, "-c", "import sys; sys.stdin.readline()"]  # as predict.py waits for `go`
    predict = run.PredictPy(waits, str(ready))
    try:
        assert not ready.exists()
        ready.touch()  # this one said it was ready, then the OOM killer took it
        predict.proc.kill()
        predict.proc.wait()
        predict.keep_beside()
        assert predict.again and predict.proc.poll() is None
        assert not ready.exists()
    finally:
        predict.proc.kill()
        predict.proc.wait()


def test_the_ready_files_folder_of_a_killed_run_py_is_removed_by_the_next(project_modules, tmp_path, monkeypatch):
    """run.py's ready file lives in a folder of its own under the temp folder, named with its pid and
    removed when it exits; a run.py killed outright (SIGKILL, as test_run_py_stopped_alone... does)
    cannot, so the next run.py removes the folders of pids that no longer run, and no other. A temp
    folder that cannot be written leaves run.py without one: predict.py starts all the same."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead, live = tmp_path / f"kagtpl-run-{gone.pid}-abc", tmp_path / f"kagtpl-run-{os.getppid()}-def"
    for folder in (dead, live):
        folder.mkdir()
        (folder / "predict-ready").touch()
    ready = Path(project_modules.run.ready_file())
    assert not dead.exists() and (live / "predict-ready").exists()
    assert ready.name == "predict-ready" and not ready.exists()
    assert ready.parent.parent == tmp_path and ready.parent.name.startswith(f"kagtpl-run-{os.getpid()}-")
    # a temp folder that cannot be written: no file, and the reserve holds predict.py's whole start
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    assert project_modules.run.ready_file() == ""
    predict = project_modules.run.PredictPy([sys.executable, "-c", "pass"], "")
    assert predict.proc.wait(timeout=30) == 0


@pytest.mark.slow
def test_predict_py_killed_after_go_is_started_again_on_the_checkpoints(project, digits_dir, tmp_path):
    """Case 3, after `go`: predict.py killed while it predicts is started again (without
    --after-train) on the checkpoints train.py left, while more than 5 s are left.

    The reserve is set to 25 s: the rule's 8% of a 60 s budget (6.7 s) is one predict.py
    that imported beside train.py, not a second one's imports too. In CI, under the other
    worker's load, the restart started with 11 s left and was still importing at the budget."""
    out = tmp_path / "out"
    proc = start_run(project, out, "--budget", "60s", "--epochs", "3", "--no-grow", "--predict-reserve", "25")
    seen = read_until(proc, r"^PREDICT: started beside train.py", [])
    os.kill(script_pid(proc.pid, "predict.py"), signal.SIGKILL)
    log = rest(proc, seen)
    assert proc.wait(timeout=60) == 0, log[-3000:]
    assert re.search(r"^RUN: predict.py died \(SIGKILL\): started again, \d+s left", log, re.M), log[-3000:]
    assert log.rstrip().splitlines()[-1].startswith(HANDED_FOLDS.format(out=out)), log[-2000:]
    from_folds(project, out, digits_dir)


@pytest.mark.slow
def test_a_folder_another_train_py_holds_is_written_by_nobody(project, tmp_path):
    """Case 4: a second run.py (or predict.py) on a folder a train.py trains in. Before, its
    train.py was refused but its predict.py wrote submission.csv into the first run's folder."""
    out = tmp_path / "out"
    first = launch(project, ["train.py", "--device", "cpu", f"--out-dir={out}"], RUN_ENV, subprocess.STDOUT)
    try:
        read_until(first, r"^Epoch 1: ", [])  # the first run's fallback is written
        mark = (out / "submission.csv").stat().st_mtime_ns
        for script in ("run.py", "predict.py"):
            r = run_script(project, script, "--device", "cpu", f"--out-dir={out}", check=False)
            assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and f"{out} is in use by another train.py (pid {first.pid})" in lines[0], r.stderr
            assert r.stdout == ""  # nothing started, nothing read
        assert (out / "submission.csv").stat().st_mtime_ns == mark
        assert not (out / "run.log").exists() and not (out / "predict.log").exists()  # their logs too
    finally:
        first.kill()
        first.wait()


HOLD_RUN_LOCK = """
import sys, time
sys.path.insert(0, sys.argv[1])
from machinery import locks
locks.lock_output(locks.Path(sys.argv[2]), "run.py", name=locks.RUN_LOCK)
print("held", flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_a_second_run_py_started_with_the_first_is_one_error(project, tmp_path):
    """Two run.py started at one instant on one folder both passed the check for a train.py before
    either train.py took the folder: both started train.py and predict.py, the second's train.py was
    refused, and its run.py ended with RUN FAILED lines after its own predict.py was refused too,
    both writing one run.log. run.py now holds a lock of its own (locks.RUN_LOCK) from its check on:
    here a process that holds it, as the first run.py does, and the second run.py is one ERROR line."""
    out = tmp_path / "out"
    out.mkdir()
    hold = [sys.executable, "-c", HOLD_RUN_LOCK, str(project), str(out)]
    first = subprocess.Popen(hold, stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "held"
        r = run_script(project, "run.py", "--device", "cpu", f"--out-dir={out}", check=False)
        assert r.returncode == 1 and r.stdout == "", r.stdout[-2000:] + r.stderr[-2000:]
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and f"ERROR: {out} is in use by another run.py (pid {first.pid})" in lines[0], r.stderr
        assert sorted(p.name for p in out.iterdir()) == [".run.lock"]  # nothing started, nothing written
    finally:
        first.kill()
        first.wait()


@pytest.mark.slow
def test_a_train_py_hung_past_the_safety_net_says_the_fallback_stayed(project, tmp_path):
    """Case 5: train.py hangs after its fallback (it ignores SIGTERM), is killed past the safety
    net, and predict.py has no time left. Before, the last line said the submission was made from
    the checkpoints there "(see the ENSEMBLE line)": there was none, and the fallback stayed. A 20 s
    budget (30 s before): the test waits for the net, at 95% of it."""
    out = tmp_path / "out"
    hang = tmp_path / "hang"
    hang.mkdir()
    (hang / "sitecustomize.py").write_text(
        "import builtins, signal, sys, time\n"
        "if sys.argv and sys.argv[0].endswith('train.py'):\n"
        "    _print = builtins.print\n"
        "    def print(*a, **k):\n"
        "        _print(*a, **k)\n"
        "        if a and str(a[0]).startswith('SUBMISSION:') and 'fallback' in str(a[0]):\n"
        "            signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "            time.sleep(3600)\n"
        "    builtins.print = print\n"
    )
    r = subprocess.run(
        [sys.executable, "run.py", "--device", "cpu", f"--out-dir={out}", "--budget", "20s"],
        cwd=project,
        env={**RUN_ENV, "PYTHONPATH": str(hang)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    log = r.stdout + r.stderr
    assert r.returncode == 1, log[-3000:]
    assert "RUN: train.py still running 1s after SIGTERM: killed" in r.stdout, log[-3000:]
    assert "ENSEMBLE" not in log and "see the ENSEMBLE line" not in log
    # predict.py has ~0 s left: run.py stops it at the budget, or it ends first on its own one line (train.py hung
    # before its first fold: no checkpoint, so this run's fallback stays); which comes first is the machine's timing
    fallback = f"handed in {out}/submission.csv, this run's fallback (the training prior): "
    stopped, kept = "predict.py was stopped at the budget before it wrote one", "predict.py kept it (its SUBMISSION "
    said = [why for why in (stopped, kept) if f"RUN: {fallback}{why}" in r.stdout]
    assert len(said) == 1, log[-3000:]
    if said == [kept]:
        assert f"SUBMISSION: {out}/submission.csv kept: train.py saved no model in this run" in r.stdout, log[-3000:]
    assert "ERROR" not in r.stderr, r.stderr[-2000:]  # no "run train.py first": it ran, and hung
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"RUN FAILED: train.py exited -9 (its message is above); {fallback}{said[0]}"), last
    nothing_left(out)


@pytest.mark.slow
def test_a_0_byte_checkpoint_is_skipped_by_predict_and_retrained_by_train(project, digits_dir, tmp_path):
    """Case 7: `truncate -s 0 output/model_fold0.pth`: torch raises an EOFError with no message and
    load_checkpoint indexed its first line (IndexError, in predict.py and in train.py's resume)."""
    out = tmp_path / "out"
    run_script(project, "train.py", "--dry-run", "--device", "cpu", f"--out-dir={out}")
    (out / "model_fold0.pth").write_bytes(b"")
    r = run_script(project, "predict.py", "--device", "cpu", f"--out-dir={out}")
    assert f"WARNING: skipping {out}/model_fold0.pth: cannot load (" in r.stdout, r.stdout[-2000:]
    assert "ENSEMBLE: 1 checkpoint(s), folds [1]" in r.stdout and "Traceback" not in r.stderr
    assert_valid_submission(project, digits_dir, str(out))
    dry = out / "dry-run"
    dry.mkdir()
    (dry / "model_fold0.pth").write_bytes(b"")  # the resume check reads it first
    (dry / "model_fold1.pth").write_bytes((out / "model_fold1.pth").read_bytes()[:5000])  # cut short
    r = run_script(project, "train.py", "--dry-run", "--device", "cpu", f"--out-dir={dry}")
    import torch

    for k in (0, 1):
        assert torch.load(dry / f"model_fold{k}.pth", weights_only=True)["fold"] == k  # trained again, whole


@pytest.mark.slow
@pytest.mark.parametrize("where", ["a file", "read-only"])
def test_an_output_folder_that_cannot_be_written_is_one_error_before_training(project, tmp_path, where):
    """Case 9: run.py, train.py and predict.py on an --out-dir that is a file, or on a read-only
    file system (a bind mount in a mount namespace of its own: root writes past a folder's mode)."""
    out, env = tmp_path / "out", forkpython(RUN_ENV, tmp_path, "images")
    if where == "a file":
        out.write_text("not a folder")
        wrap = []
    else:
        if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
            pytest.skip("no mount namespace here (unshare -m)")
        out.mkdir()
        wrap = ["unshare", "-m", "sh", "-c", f'mount --bind -o ro "{out}" "{out}" && exec "$0" "$@"', env["PYTHON"]]
    for script in ("run.py", "train.py", "predict.py"):
        args = (script, "--device", "cpu", f"--out-dir={out}")
        if wrap:  # through the fork server too, its runner in unshare's mount namespace (forkserver.py)
            r = subprocess.run([*wrap, *args], cwd=project, env=env, capture_output=True, text=True, timeout=120)
        else:  # through the fork server (conftest.launch), its imports paid once: 12.2 s cold for the three
            r = run_script(project, *args, timeout=120, check=False)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and str(out) in lines[0], (script, r.stdout[-1500:], r.stderr)
        nothing = script == "predict.py" and where == "a file"  # no folder: nothing to predict from, said so
        assert lines[0].startswith("ERROR: ") and ("no loadable" if nothing else "cannot") in lines[0], lines[0]
        assert "FOLD" not in r.stdout and "Epoch" not in r.stdout
    assert out.is_file() or not any(out.iterdir())


@pytest.mark.parametrize("budget", ["0s", "00", "0", "99999999h"])
def test_a_budget_of_no_time_or_past_any_clock_is_one_error_before_anything_starts(project_modules, budget, tmp_path):
    """Case 12: --budget 0s and 00 started both scripts and killed them a second later;
    99999999h overflowed predict.py's --deadline range and the fallback was handed in."""
    proj = Path(project_modules.train.__file__).parent
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "run.py", "--budget", budget, "--device", "cpu", f"--out-dir={out}"],
        cwd=proj, env=RUN_ENV, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith(f"ERROR: --budget: budget '{budget}'"), (
        r.stderr
    )
    assert "must be from 1s to 30 days" in lines[0] and r.stdout == "" and not out.exists()


def test_files_read_back_answer_bad_content_with_one_line(project_modules, digits_dir, tmp_path, capsys):
    """Case 8: the decode cache cut short, tta_views.json of any shape or a folder of its name,
    serve_defaults.json garbled, the experiments table unreadable or a folder."""
    m = project_modules
    paths = sorted(str(p) for p in (digits_dir / "train").glob("*.jpg"))[:12]
    names = [f"row {i}" for i in range(len(paths))]
    cache = m.images.image_cache(paths, names, 32, tmp_path / "cache", "train", 0)
    first = np.array(cache)
    data_file = tmp_path / "cache" / "train_32px.u8"
    with open(data_file, "r+b") as f:
        f.truncate(data_file.stat().st_size // 2)  # a full disk cut it short
    again = m.images.image_cache(paths, names, 32, tmp_path / "cache", "train", 0)
    assert "(cut short): decoded again" in capsys.readouterr().out
    assert (np.array(again) == first).all()

    views, plan, known = m.tta_views, ["image"], ["image", "hflip", "zoom"]
    for text in ("[1]", "{", '{"signature": "s", "views": [[1]]}', '{"signature": "s", "views": "image"}', "\xff"):
        (tmp_path / views.FILE).write_text(text, encoding="latin-1")
        assert views.read(tmp_path, "s", plan, known) == plan
    (tmp_path / views.FILE).unlink()
    (tmp_path / views.FILE).mkdir()  # a folder of that name: read, forget and write go on
    assert views.read(tmp_path, "s", plan, known) == plan
    views.forget(tmp_path)
    views.write(tmp_path, ["image", "zoom"], "s", {1: 0.5})
    assert "is a folder" in capsys.readouterr().out and (tmp_path / views.FILE).is_dir()

    for text in ("", "{", "[1, 2]", '{"id_col": "id", "values": {}, "columns": ["x"]}'):
        (tmp_path / m.serving.DEFAULTS_FILE).write_text(text)
        with pytest.raises(m.errors.RunError, match="serve_defaults.json (does not read|is not train.py's)"):
            m.serving.read_defaults(tmp_path)
        with pytest.raises(m.errors.RunError, match=r": run python train.py --out-dir x again to write it$"):
            m.serving.read_defaults(tmp_path, "python train.py --out-dir x")

    table = tmp_path / "experiments.csv"
    table.write_bytes(b"time,run\x00,model\n\xff\xfe")
    row = {"run": "r1", "model": "resnet18", "stop": "done"}
    m.experiments.append(table, row)
    said = capsys.readouterr().out
    assert "does not read" in said and (tmp_path / "experiments.unreadable.csv").read_bytes().startswith(b"time")
    assert [r["run"] for r in m.experiments.read(table)] == ["r1"]
    # a table cut short mid-row: that row's last field read (a CV of 0.98665 cut to 0.98) is not
    # trusted; the row is kept, ranked last, and says why
    scored = {**row, "metric": "AUC", "higher_is_better": "True"}
    m.experiments.append(table, {**scored, "run": "r2", "cv": "0.97"})
    m.experiments.append(table, {**scored, "run": "r3", "cv": "0.98665"})
    text = table.read_text()
    table.write_text(text[: text.rindex("0.98665") + 4])
    read = m.experiments.ranked([r for r in m.experiments.read(table) if r["metric"] == "AUC"])
    assert [(r["run"], r["cv"], r["stop"]) for r in read] == [
        ("r2", "0.97", "done"),
        ("r3", "", "cut short (line 4 of the table ends early)"),
    ]
    longer = [line + ",x,y" if "0.98665" in line else line for line in text.splitlines()]
    table.write_text("\n".join(longer) + "\n")  # more fields than the header: read, not cut short
    read = {r["run"]: (r["cv"], r["stop"]) for r in m.experiments.read(table) if r["metric"] == "AUC"}
    assert read == {"r2": ("0.97", "done"), "r3": ("0.98665", "done")}
    table.unlink()
    table.mkdir()
    m.experiments.append(table, row)
    assert "is a folder" in capsys.readouterr().out and table.is_dir()


def test_csvs_and_logs_read_back_cut_short_are_left_out_with_a_line(project_modules, tmp_path, capsys):
    """Case 8 too: a file this project wrote, cut short or emptied after (a full disk, a copy stopped
    midway). Half an OOF file parsed, its cut row as NaN (the metric raised at train.py's end after
    every fold had trained); an empty one raised EmptyDataError; a JSON log whose last record was
    cut raised in read_records, and the next run's first record was glued onto it."""
    m = project_modules
    oof = pd.DataFrame({"id": [f"r{i}" for i in range(40)], "fold": 0, "target": 1, "p": 0.5})
    path = tmp_path / "oof_fold0.csv"
    m.storage.write_csv_atomic(m.artifacts.signed(oof, "sig1"), path)
    whole = path.read_bytes()
    assert len(m.artifacts.read_signed(path, "sig1")) == 40
    for damage, why in (
        (b"", "empty: 0 bytes"),
        (whole[: len(whole) // 2], "end mid-line"),
        (b"\xff\xfe\n", "UnicodeDecodeError"),
    ):
        path.write_bytes(damage)
        with pytest.raises(m.errors.Damaged, match=re.escape(why)):
            m.readback.read_ours(path)
        assert m.artifacts.read_signed(path, "sig1") is None  # its rows left out, with a line
        said = capsys.readouterr().out
        assert said.startswith("OOF: oof_fold0.csv left out: it does not read back ("), said
        assert "its fold's model is still ensembled" in said

    ids, y = np.array([f"r{i}" for i in range(30)]), np.arange(30) % 2
    first, name = m.artifacts.fixed_folds(tmp_path, ids, y, 3, 42, True)
    folds = tmp_path / name
    made = folds.read_bytes()
    folds.write_bytes(made[: len(made) // 3])
    again, _ = m.artifacts.fixed_folds(tmp_path, ids, y, 3, 42, True)
    assert "FOLDS: folds-k3-seed42.csv does not read back (cut short" in capsys.readouterr().out
    assert folds.read_bytes() == made  # the same folds again: every OOF file made with them still compares
    assert [v.tolist() for pair in first for v in pair] == [v.tolist() for pair in again for v in pair]

    (tmp_path / "config.json").write_text('{"config": {"id_col": "id"}, "cla')
    with pytest.raises(m.errors.Damaged, match="config.json does not read back"):
        m.storage.read_config(tmp_path)

    log_path = tmp_path / "train_log.jsonl"
    earlier = m.logs.JsonLog(log_path, "run1", False)
    earlier.write(fold=0, epoch=1)
    with open(log_path, "a") as f:
        f.write('{"run": "run1", "fold": 0, "ep')  # its last record cut short
    log = m.logs.JsonLog(log_path, "run2", False)
    log.write(fold=0, epoch=1)
    log.write(fold=0, epoch=2)
    assert [r["epoch"] for r in m.logs.read_records(log_path, "run2")] == [1, 2]  # the first not glued to the cut line
    assert "WARNING: " in capsys.readouterr().out and len(m.logs.read_records(log_path, "run1")) == 1


def test_the_socket_folders_of_gone_processes_are_swept_and_no_other(project_modules, tmp_path):
    """loader_sockets.sweep removes the folders it names for a pid (pymp-k<pid>-XXXXXXXX) whose
    process is gone, and nothing else: multiprocessing's own (pymp-XXXXXXXX, random letters and
    digits but never a "-": pymp-k1234567 is one), a live process's, another program's."""
    import importlib

    sockets = importlib.import_module("machinery.loader_sockets")
    gone = subprocess.Popen(["true"])
    gone.wait()
    names = [f"pymp-k{gone.pid}-abcdefgh", f"pymp-k{os.getpid()}-abcdefgh", "pymp-k1234567", "pymp-x1y2z3w4", "kept"]
    for name in names:
        (tmp_path / name).mkdir()
    assert sockets.sweep(str(tmp_path)) == [f"pymp-k{gone.pid}-abcdefgh"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[1:])


def test_serving_never_raises_on_a_batch_without_ids_and_answers_an_empty_one(project_modules):
    """Case 13: a batch without its id column (or None) was "answered with the fallback", which
    then raised into the gateway; a legal empty batch was counted as a failure."""
    serving = project_modules.serving
    defaults = {"id_col": "id", "values": {"p": 0.5}, "columns": ["id", "p"], "signature": "s"}

    def fn(state, batch):
        return pd.DataFrame({"id": batch["id"], "p": 0.9})

    answerer = serving.Answerer(fn, defaults, 5.0, 5.0, serving.tasks.get("image"))
    for batch in (pd.DataFrame({"other": [1, 2]}), None):
        answer = answerer(batch)
        assert list(answer.columns) == ["id", "p"] and list(answer["p"]) == [0.5] * len(answer)
    assert answerer.fallbacks == 2
    empty = answerer(pd.DataFrame({"id": pd.Series([], dtype=str)}))
    assert len(empty) == 0 and list(empty.columns) == ["id", "p"] and answerer.fallbacks == 2
    ok = answerer(pd.DataFrame({"id": ["a", "b"]}))
    assert list(ok["p"]) == [0.9, 0.9]


def test_a_failed_call_of_masks_or_boxes_answers_none_not_the_last_images(project_modules):
    """A served segmentation run answered a failed call with the last good answer's most common
    RLE: another image's mask on every image of the batch, below the empty masks' score. Masks and
    boxes answer train.py's fallback, in its words; a prior over rows still carries the last answer."""
    serving = project_modules.serving
    defaults = {"id_col": "id", "values": {"rle": ""}, "columns": ["id", "rle"], "signature": "s"}

    def fn(state, batch):
        if batch["id"].iloc[0] == "bad":
            raise ValueError("a bad batch")
        return pd.DataFrame({"id": batch["id"], "rle": "1 5"})

    for task, kept in (("segmentation", ""), ("detection", ""), ("audio", "1 5")):
        answerer = serving.Answerer(fn, defaults, 5.0, 5.0, serving.tasks.get(task))
        assert list(answerer(pd.DataFrame({"id": ["a", "b"]}))["rle"]) == ["1 5", "1 5"]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            answer = answerer(pd.DataFrame({"id": ["bad", "c"]}))
        assert list(answer["rle"]) == [kept, kept], (task, answer)
        words = "the last good answer's values" if kept else serving.tasks.get(task).fallback
        assert out.getvalue().strip().endswith(f"answered with the fallback ({words})"), out.getvalue()
    # the long format (id, class, rle): each row keeps the class its batch gave, where the first
    # sample row's class ("ellipse", serve_defaults.json's) stood on every row
    long = {"id_col": "id", "values": {"class": "ellipse", "rle": ""}, "columns": ["id", "class", "rle"], "kind": "rle"}
    batch = pd.DataFrame({"id": ["a", "a", "b"], "class": ["ellipse", "rectangle", "rectangle"]})
    answerer = serving.Answerer(fn, long, 5.0, 5.0, serving.tasks.get("segmentation"))
    with contextlib.redirect_stdout(io.StringIO()):
        answer = answerer(batch.assign(id=["bad", "a", "b"]))
    assert answer.to_dict("list") == {"id": ["bad", "a", "b"], "class": list(batch["class"]), "rle": [""] * 3}
    assert list(serving.prior_answer(long, {}, batch)["class"]) == list(batch["class"])
    labels = {"id_col": "id", "values": {"class": "x", "p": 0.5}, "columns": ["id", "class", "p"], "kind": "label"}
    assert list(serving.prior_answer(labels, {}, batch)["class"]) == ["x"] * 3  # a prediction, not the batch's


def test_a_failed_call_of_class_labels_answers_the_most_common_label_not_their_mean(project_modules, tmp_path):
    """Class labels that are numbers (0-4, as Cassava's): a failed call was answered with the last
    answer's mean, 2.6, no class at all. train.py's fallback writes serve_defaults.json with its
    values' kind, and for labels the fallback carries the most common one; numbers stay averaged."""
    serving, artifacts = project_modules.serving, project_modules.artifacts
    sample = pd.DataFrame({"image_id": ["a", "b", "c"], "label": [0, 0, 0]})
    for submission, labels in (("label", True), ("probs", False)):
        out = tmp_path / submission
        out.mkdir()
        args = argparse.Namespace(out_dir=str(out), start_time=time.time(), signature="s")
        classes = [0, 1, 2, 3, 4] if submission == "label" else ["p"]
        config = {"problem": "multiclass" if labels else "regression", "submission": submission}
        y = np.array([3, 3, 1, 0, 3]) if labels else np.array([0.5, 1.5])
        artifacts.fallback_submission(args, sample, y, classes, config)
        assert serving.read_defaults(out)["kind"] == ("label" if labels else "number")
    defaults = serving.read_defaults(tmp_path / "label")
    last = pd.DataFrame({"image_id": ["a", "b", "c", "d", "e"], "label": [4, 1, 4, 0, 4]})
    assert list(serving.fallback(pd.DataFrame({"image_id": ["f", "g"]}), defaults, last)["label"]) == [4, 4]
    numbers = {**defaults, "kind": "number"}
    assert list(serving.fallback(pd.DataFrame({"image_id": ["f"]}), numbers, last)["label"]) == [2.6]


def test_the_kaggle_notebook_reads_the_competition_its_metadata_attaches(project_modules, monkeypatch, tmp_path):
    """Case 11: a project made without --competition, packaged with --competition titanic: the
    metadata attached titanic, but train.py read /kaggle/input/<the project's name>."""
    hardware = project_modules.hardware
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Batch")
    monkeypatch.setenv("KAGGLE_ROOT", str(tmp_path))
    (tmp_path / "input" / "titanic").mkdir(parents=True)
    assert hardware.data_and_output_dirs("my-project", "/data")[0] == str(tmp_path / "input" / "my-project")
    monkeypatch.setenv("KAGTPL_COMPETITION", "titanic")
    assert hardware.data_and_output_dirs("my-project", "/data") == (
        str(tmp_path / "input" / "titanic"),
        str(tmp_path / "working"),
    )


@pytest.mark.slow
def test_train_py_killed_outright_takes_its_fold_workers_before_predict_reads_the_folder(project, digits_dir, tmp_path):
    """Case 6: the OOM killer takes train.py (SIGKILL) while two fold workers train. They get
    SIGTERM with its death (a parent-death signal) and save; run.py ends what is left of
    train.py's process group before it starts train.py again (once: a death run.py did not cause)
    and before `go`, so nothing trains on unseen or writes while predict.py reads. Killed again,
    the folds saved are handed in and the run ends 1 saying train.py failed."""
    out = tmp_path / "out"
    flags = ["--budget", "240s", "--parallel", "folds", "--devices", "cpu,cpu", "--folds", "4"]
    proc = start_run(project, out, *flags)
    seen = []
    for attempt in ("first", "started again"):
        # a validated epoch: under CI's load (17 s an epoch) the plan was cut to 1 epoch, and no Epoch 2 came
        seen = read_until(proc, r"^\[cpu\d\] Epoch 1: ", seen)
        train = script_pid(proc.pid, "train.py")
        workers = children_of(train)
        assert workers, f"no fold workers ({attempt})"
        os.kill(train, signal.SIGKILL)
        if attempt == "first":
            seen = read_until(proc, r"^RUN: train.py died \(SIGKILL\): started again once", seen)
            for pid in workers:  # ended before the second train.py started
                assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    log = rest(proc, seen)
    assert proc.wait(timeout=60) == 1, log[-3000:]
    assert log.count("started again once") == 1, log[-3000:]
    assert "RUN: train.py FAILED (exit -9); predicting from the checkpoints there are" in log
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    assert re.search(r"^ENSEMBLE: [1-4] checkpoint\(s\)", log, re.M), log[-3000:]
    failed = f"RUN FAILED: train.py exited -9 (its message is above); handed in {out}/submission.csv"
    assert log.rstrip().splitlines()[-1].startswith(f"{failed}, predict.py's ensemble"), log[-2000:]
    from_folds(project, out, digits_dir)
    nothing_left(out)


@pytest.mark.slow
def test_train_py_killed_by_another_is_started_again_and_the_run_hands_in_every_fold(project, digits_dir, tmp_path):
    """The OOM killer (or a kill -9) takes train.py after its first fold, with most of the budget
    left: run.py starts it again once, it resumes past the complete fold (its fallback written
    again in place: the earlier run's submission.earlier.csv stays the earlier run's), and the
    run hands in every planned fold, exit 0. Before, the run handed in one fold and ended 1 with
    most of its budget unused."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "submission.csv").write_text("an earlier run's file\n")
    proc = start_run(project, out, "--budget", "90s", "--epochs", "2")
    seen = read_until(proc, r"^FOLD 0 DONE: ", [])
    os.kill(script_pid(proc.pid, "train.py"), signal.SIGKILL)
    log = rest(proc, seen)
    assert proc.wait(timeout=60) == 0, log[-3000:]
    assert re.search(r"^RUN: train.py died \(SIGKILL\): started again once, \d+s before the safety net", log, re.M)
    again = log[log.index("started again once") :]
    assert "FOLD 0: model_fold0.pth is complete, skipping (resume)" in again, log[-3000:]  # not trained again
    assert "FOLD 1 DONE" in again and "FOLD 2 DONE" in again, log[-3000:]
    assert re.search(r"^SUBMISSION: \S+ \(40 rows, 3 fold\(s\) ensembled\)$", log, re.M), log[-3000:]
    assert log.rstrip().splitlines()[-1].startswith(HANDED_FOLDS.format(out=out)), log[-2000:]
    assert (out / "submission.earlier.csv").read_text() == "an earlier run's file\n"
    from_folds(project, out, digits_dir)
    nothing_left(out)


def kill_new_children(pid: int, before: list[int], timeout: float = 30) -> list[int]:
    """SIGKILL the children `pid` starts after `before` was taken (its DataLoader workers), as soon
    as there are any: the OOM killer's choice, often."""
    t_end = time.time() + timeout
    while time.time() < t_end:
        new = [c for c in children_of(pid) if c not in before]
        if new:
            for child in new:
                os.kill(child, signal.SIGKILL)
            return new
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} started no child in {timeout}s")


WORKER_DIED = (
    r"^WARNING: DataLoader worker \(pid\(s\) [\d, ]+\) (exited unexpectedly|died as it handed over a batch "
    r"\(\w+\)) \(killed: the OOM killer, or a kill -9\): the pass goes on from batch \d+ of \d+ on 1 loader "
    r"worker\(s\), not 2$"
)


@pytest.mark.slow
def test_a_killed_loader_worker_costs_neither_the_training_nor_the_submission(project, digits_dir, tmp_path):
    """The OOM killer often takes a DataLoader worker (each holds batches in flight); a kill -9
    does the same. train.py stopped with a traceback (under run.py: FAILED at 0.22 of the budget,
    the rest unused), and predict.py's handed in the fallback beside the trained folds. Now the
    pass goes on from the batch it stopped at on half the workers, with one WARNING: train.py
    trains every planned fold, and predict.py writes the very submission of a run nobody disturbed."""
    out = tmp_path / "out"
    args = ["train.py", "--device", "cpu", f"--out-dir={out}", "--workers", "2", "--epochs", "2"]
    proc = launch(project, args, RUN_ENV, subprocess.STDOUT, new_session=True)
    seen = read_until(proc, r"^FOLD 1 \(", [])
    kill_new_children(proc.pid, children_of(proc.pid))  # fold 1's first loader workers
    log = rest(proc, seen)
    assert proc.wait(timeout=60) == 0, log[-3000:]
    assert len(re.findall(WORKER_DIED, log, re.M)) == 1 and "Traceback" not in log, log[-3000:]
    assert all(f"FOLD {k} DONE: " in log for k in range(3)), log[-3000:]
    predict = ["predict.py", "--device", "cpu", f"--out-dir={out}", "--workers", "2", "--batch-size", "1"]
    run_script(project, *predict)
    undisturbed = (out / "submission.csv").read_bytes()
    proc = launch(project, predict, RUN_ENV, subprocess.STDOUT, new_session=True)
    kill_new_children(proc.pid, [])  # its first fold's loader workers: 40 batches of one image each
    log = rest(proc, [])
    assert proc.wait(timeout=60) == 0 and len(re.findall(WORKER_DIED, log, re.M)) == 1, log[-3000:]
    assert (out / "submission.csv").read_bytes() == undisturbed  # every row read once, in order
    nothing_left(out)
