"""The generated project's machinery modules (gpu, logs, engine, storage, submission, images),
imported from a rendered project. GPU-only behaviour goes through one seam: GpuMonitor's reader
(peak bytes, total bytes); the AMP mode comes from a compute capability, so any GPU's can be
passed in."""

from __future__ import annotations

import argparse
import functools
import gc
import io
import os
import re
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

GB = 1024**3


def test_epoch_lines_at_most_one_a_second_and_the_last_always(project_modules, capsys):
    """A table MLP's fast epochs: 30 in 3.75 s print the first, one a second and the last."""
    t = [0.0]
    lines = project_modules.logs.EpochLines(clock=lambda: t[0])
    for epoch in range(1, 31):
        lines.show(f"Epoch {epoch}")
        t[0] += 0.125  # exact in binary: a line at 0, 1, 2 and 3 s
    lines.flush()
    lines.flush()  # nothing held twice
    shown = capsys.readouterr().out.split()
    assert shown[::2] == ["Epoch"] * len(shown[1::2])
    assert [int(e) for e in shown[1::2]] == [1, 9, 17, 25, 30]


class Console(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("tty", [True, False], ids=["terminal", "pipe"])
def test_progress_inside_an_epoch_as_a_terminal_and_as_a_pipe(project_modules, monkeypatch, tty):
    """40 steps of 1 s each: a terminal redraws one line in place (cleared at the end, for the
    Epoch line); a pipe gets a PROGRESS line every 30 s and nothing else."""
    console = Console(tty)
    monkeypatch.setattr(sys, "stdout", console)
    t = [100.0]
    progress = project_modules.logs.StepProgress("fold 0 epoch 1", 40, clock=lambda: t[0])
    asked = []
    for done in range(1, 41):
        t[0] += 1.0
        progress.step(done, 32 * done, lambda d=done: asked.append(d) or 1.0 / d)
    progress.close()
    out = console.getvalue()
    if tty:
        frames = out.split("\r\033[K")
        assert frames[0] == "" and frames[-1] == "" and len(frames) == 42  # 40 redraws, then cleared
        assert frames[30] == "fold 0 epoch 1 step 30/40, 32 samples/s, ETA 10s, loss 0.0333"
        assert "\n" not in out
    else:
        assert out == "PROGRESS: fold 0 epoch 1 step 30/40, 32 samples/s, ETA 10s, loss 0.0333\n"
        assert asked == [30]  # the loss is read from the device only when shown


def test_gpu_lines_through_a_fake_memory_reader(project_modules):
    m = project_modules
    resets = []
    monitor = m.gpu.GpuMonitor(
        torch.device("cpu"), reader=lambda: (int(18.31 * GB), 24 * GB), reset=lambda: resets.append(1)
    )
    assert m.logs.memory_used_lines(monitor.peak(), 128, ("rule", "the GPU profile's rule")) == [
        "GPU Memory Used: 18.31 GB / 24.0 GB (76.3%)",
        "VALIDATION: batch_size=128, 76.3% of GPU memory, set by rule (the GPU profile's rule): OK",
    ]
    assert monitor.field() == "18.31GB (76.3%)"
    monitor.reset()
    assert resets == [1]
    stats = {"train_loss": 0.5, "val_loss": 0.4, "metric": 0.9, "lr": 1e-3, "time_s": 12.0, "samples_per_s": 800.0}
    line = m.logs.epoch_line(3, stats, "Acc", monitor.field())
    assert re.fullmatch(
        r"Epoch 3: Loss=0\.5000, ValLoss=0\.4000, Acc=0\.9000, LR=1\.00e-03, Time=12\.0s, "
        r"Throughput=800 samples/s, GPU=18\.31GB \(76\.3%\)",
        line,
    )


def test_cpu_lines_are_honest(project_modules):
    m = project_modules
    monitor = m.gpu.GpuMonitor(torch.device("cpu"))
    assert monitor.peak() is None and monitor.field() == "none"
    assert m.logs.memory_used_lines(monitor.peak(), 32, ("rule", ""))[0] == "GPU Memory Used: none (CPU run)"
    amp = m.gpu.Amp("off", torch.device("cpu"))
    lines = m.logs.resource_lines(2, 32, "none", amp.enabled, 0.0, m.hardware.loader_settings(2, False))
    assert lines == [
        "RESOURCES: 2 CPU cores, batch=32, GPU=none, Mixed Precision=OFF",
        "GPU Memory: none",
        "DataLoader: num_workers=1, prefetch_factor=4, persistent_workers=True",
    ]


def test_resource_lines_on_a_gpu(project_modules):
    m = project_modules
    amp = m.gpu.Amp(m.hardware.amp_mode((8, 6)), torch.device("cpu"))
    lines = m.logs.resource_lines(30, 128, "NVIDIA A10", amp.enabled, 22.5, m.hardware.loader_settings(30, True))
    assert lines[0] == "RESOURCES: 30 CPU cores, batch=128, GPU=NVIDIA A10, Mixed Precision=ON"
    assert lines[1] == "GPU Memory: 22.5 GB"
    assert lines[2] == "DataLoader: num_workers=12, prefetch_factor=3, persistent_workers=True"


@pytest.mark.parametrize(
    "capability,enabled,dtype,scaler",
    [
        ((7, 5), True, torch.float16, True),  # T4: fp16 + GradScaler
        ((8, 0), True, torch.bfloat16, False),  # A100: bf16, no scaler
        ((6, 0), False, None, False),  # P100: fp32
        (None, False, None, False),  # CPU: off
    ],
)
def test_amp_policy_from_capability(project_modules, capability, enabled, dtype, scaler):
    m = project_modules
    amp = m.gpu.Amp(m.hardware.amp_mode(capability), torch.device("cpu"))
    assert amp.enabled == enabled and amp.scaler.is_enabled() == scaler
    if enabled:
        assert amp.dtype == dtype


def _loader(n_batches, batch=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n_batches * batch, 3, 2, 2, generator=g), torch.randint(0, 3, (n_batches * batch,), generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch), x, y


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))


@pytest.mark.parametrize(
    "accum,groups", [(1, [[0], [1], [2], [3], [4]]), (2, [[0, 1], [2, 3], [4]]), (5, [[0, 1, 2, 3, 4]])]
)
def test_accumulation_steps_on_the_last_partial_group_with_the_right_scale(project_modules, accum, groups):
    m = project_modules
    loader, x, y = _loader(5)
    model, ref = _model(), _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    steps = []

    def batch_loss(batch):  # the image Competition's loss, on this tiny model
        xb, yb = batch
        return m.train.loss_fn(model(xb), yb), len(yb)

    m.steps.run_epoch(
        loader,
        len(loader),
        batch_loss,
        opt,
        sched,
        m.gpu.Amp("off", torch.device("cpu")),
        m.engine.Batching(4, accum, 0.5),
        on_first_step=lambda: steps.append(sched.last_epoch),
    )
    assert sched.last_epoch == len(groups) and steps == [1]
    # the same updates by hand: each group's gradient is the mean of its batches' mean losses
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    for group in groups:
        ref_opt.zero_grad()
        loss = sum(
            torch.nn.functional.cross_entropy(ref(x[b * 4 : (b + 1) * 4]), y[b * 4 : (b + 1) * 4]) for b in group
        )
        (loss / len(group)).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q)


def test_adamw_is_fused_over_float_parameters_and_steps_like_the_default_through_a_real_grad_scaler(project_modules):
    """make_optimizer asks for the fused AdamW when every parameter is floating point on a CPU or a
    card: its updates are the default AdamW's, and a real fp16 GradScaler still skips an inf step.
    A parameter it cannot fuse (a frozen uint8 tensor, as QLoRA's 4-bit weights) keeps the default."""
    m = project_modules

    class Plain:  # a Competition without param_groups: every parameter in one group
        pass

    model, ref = _model(), _model()
    opt = m.steps.make_optimizer(Plain(), model, 1e-2, 0.05)
    assert opt.defaults["fused"] is True
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.05)  # PyTorch's default on CPU
    assert ref_opt.defaults["fused"] is None
    amp = m.gpu.Amp("fp16", torch.device("cpu"))  # real half precision and a real GradScaler on CPU
    x, y = torch.randn(8, 12), torch.randint(0, 3, (8,))
    for _ in range(3):
        for mod, o in ((model, opt), (ref, ref_opt)):
            o.zero_grad()
            torch.nn.functional.cross_entropy(mod(x), y).backward()
            o.step()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    with amp.autocast():
        loss = model(x).float().sum() * float("inf")
    amp.backward(loss)
    amp.step(opt)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))  # skipped, not NaN

    frozen = _model()
    frozen.register_parameter("packed", torch.nn.Parameter(torch.zeros(4, dtype=torch.uint8), requires_grad=False))
    assert m.steps.make_optimizer(Plain(), frozen, 1e-2, 0.0).defaults["fused"] is None


def test_check_submission_catches_each_mistake(project_modules):
    check_submission = project_modules.submission.check_submission
    sample = pd.DataFrame({"id": ["a", "b"], "x": [0.5, 0.5], "y": [0.5, 0.5]})
    good = pd.DataFrame({"id": ["a", "b"], "x": [0.2, 0.9], "y": [0.8, 0.1]})
    check_submission(good, sample, "distribution")
    cases = {
        "columns": good[["id", "y", "x"]],
        "rows": good.iloc[:1],
        "id 'b'": good.assign(id=["a", "c"]),
        "within [0, 1]": good.assign(x=[1.2, 0.9]),
        "sum to 1": good.assign(x=[0.3, 0.9]),
    }
    for message, bad in cases.items():
        with pytest.raises(ValueError, match=re.escape(message) if message != "id 'b'" else "row 1"):
            check_submission(bad, sample, "distribution")


def test_check_submission_kinds_for_tables(project_modules):
    check_submission = project_modules.submission.check_submission
    sample = pd.DataFrame({"id": ["a", "b"], "target": [0.5, 0.5]})
    check_submission(sample.assign(target=[0.1, 0.9]), sample, "probability")
    with pytest.raises(ValueError, match="within"):
        check_submission(sample.assign(target=[0.1, 1.9]), sample, "probability")
    check_submission(sample.assign(target=[3.5, -2.0]), sample, "number")
    with pytest.raises(ValueError, match="finite"):
        check_submission(sample.assign(target=[np.nan, 1.0]), sample, "number")
    check_submission(sample.assign(target=["cat", "dog"]), sample, "label", labels=["cat", "dog"])
    with pytest.raises(ValueError, match="'cow' is not a class"):
        check_submission(sample.assign(target=["cat", "cow"]), sample, "label", labels=["cat", "dog"])


def test_atomic_write_keeps_the_old_file_when_writing_fails(project_modules, tmp_path):
    storage = project_modules.storage
    target = tmp_path / "submission.csv"
    target.write_text("old")

    def broken(tmp):
        open(tmp, "w").write("half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        storage.atomic_write(target, broken)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["submission.csv"]


ENDS_NOW = """
import atexit
from torch.utils.data import DataLoader
from machinery import errors, loader_sockets

def main(argv):
    global loader  # alive to the end, as train.py's last fold's loaders are
    loader_sockets.socket_dir()  # as hardware.flag_loader makes it: the workers' folder, removed by end_now
    loader = DataLoader(list(range(8)), batch_size=2, num_workers=1, persistent_workers=True)
    next(iter(loader))
    atexit.register(print, "TEARDOWN")
    print("WORKER", loader._iterator._workers[0].pid)
    print("DONE")

errors.main(main)
"""


def gone(pid: int, within: float) -> bool:
    """The process has ended (or is a zombie) within `within` seconds."""
    end = time.time() + within
    while time.time() < end:
        try:
            if open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_a_script_that_finishes_skips_the_teardown_and_ends_its_loader_workers(project_modules, tmp_path):
    """train.py's teardown took 4-6 s after DONE on a loaded machine and ran past run.py's safety
    net (exit -15 from finished work): errors.main ends a finished script at once, its output
    flushed and its DataLoader workers ended (left alone, one outlived it by seconds, holding a
    caller's pipe open until its own watchdog noticed)."""
    script, out = tmp_path / "finish.py", tmp_path / "out.txt"
    script.write_text(ENDS_NOW)
    root = Path(project_modules.errors.__file__).parents[1]
    with open(out, "w") as f:
        env = {**os.environ, "PYTHONPATH": str(root)}
        r = subprocess.run([sys.executable, str(script)], env=env, stdout=f, stderr=subprocess.STDOUT, timeout=60)
    lines = out.read_text().splitlines()
    assert r.returncode == 0 and lines[-1] == "DONE", lines
    assert "TEARDOWN" not in lines  # atexit handlers are the teardown's: not run
    worker = int(lines[0].split()[1])
    assert gone(worker, within=1.0), "the loader's worker outlived its script (its watchdog ends it within 5 s)"


ENDS_WITH = """
import argparse, atexit, sys
from machinery import errors

def main(argv):
    atexit.register(print, "TEARDOWN")
    how = sys.argv[1]
    if how == "run-error":
        raise errors.DataError("data/train.csv, row 7: no label")
    if how == "ctrl-c":
        raise KeyboardInterrupt
    if how == "message":
        sys.exit("ERROR: said by sys.exit")
    argparse.ArgumentParser(prog="train.py").parse_args(sys.argv[2:])

errors.main(main)
"""


@pytest.mark.parametrize(
    "how,code,stderr",
    [
        ("run-error", 1, "PREFLIGHT ERROR: data/train.csv, row 7: no label"),
        ("ctrl-c", 130, "STOPPED: interrupted (Ctrl-C); every file written so far is whole"),
        ("message", 1, "ERROR: said by sys.exit"),
        ("flags --help", 0, ""),
        ("flags --bad", 2, "train.py: error: unrecognized arguments: --bad"),
    ],
)
def test_a_script_that_stops_on_an_error_skips_the_teardown_too(project_modules, tmp_path, how, code, stderr):
    """A one-line error, Ctrl-C and argparse's own exits end as a finished script does (end_now),
    with their exit code and lines: the teardown of torch, torchvision, sklearn and the boosters
    had taken 2.5 s after a flag error's one line (tests/test_bad_input.py: 241 s -> 176 s)."""
    script = tmp_path / "stop.py"
    script.write_text(ENDS_WITH)
    env = {**os.environ, "PYTHONPATH": str(Path(project_modules.errors.__file__).parents[1])}
    r = subprocess.run([sys.executable, str(script), *how.split()], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == code, r.stderr
    assert "TEARDOWN" not in r.stdout  # atexit handlers are the teardown's: not run
    assert (r.stderr.strip().splitlines() or [""])[-1] == stderr and "Traceback" not in r.stderr, r.stderr
    if how == "flags --help":
        assert r.stdout.startswith("usage: train.py"), r.stdout


def test_ensemble_and_corrupt_checkpoint(project_modules, tmp_path, capsys):
    m = project_modules
    m.storage.save_checkpoint(tmp_path / "model_fold2.pth", torch.nn.Linear(2, 2), {"model": "m"}, ["a", "b"], fold=2)
    m.storage.save_checkpoint(tmp_path / "model_fold10.pth", torch.nn.Linear(2, 2), {"model": "m"}, ["a"], fold=10)
    (tmp_path / "model_fold0.pth").write_bytes(b"\x80\x02garbage")
    torch.save({"weights": torch.zeros(1)}, tmp_path / "model_fold1.pth")
    found = m.storage.fold_checkpoints(tmp_path)
    assert [c["fold"] for _, c in found] == [2, 10]
    out = capsys.readouterr().out
    assert "skipping" in out and "model_fold0.pth" in out and "model_fold1.pth" in out
    # the mean of the folds' probabilities, as float64; rows that drift from 1 (float32 softmax) are renormalised
    ids = ["a"]
    probs, folds = m.submission.ensemble([np.array([[0.2, 0.8]]), np.array([[0.6, 0.4]]), np.array([[0.1, 0.9]])], ids)
    np.testing.assert_allclose(probs, [[0.3, 0.7]])
    assert folds == 3
    drift, _ = m.submission.ensemble([np.array([[0.3, 0.7002]], np.float32)], ids)
    assert drift.dtype == np.float64 and drift.sum() == pytest.approx(1.0, abs=1e-12)


def test_a_checkpoint_of_an_earlier_kagtpl_resumes_and_ensembles_with_the_new_ones(project_modules):
    """The LR a checkpoint records is the one used (scaled to the probe's batch); resume compares the
    flag as given (`given`). A checkpoint written before `given` was kept is not compared on it, nor
    on the `run` keys it lacks: after `kagtpl update`, its complete folds resume and are ensembled."""
    storage = project_modules.storage
    keys = ("epochs", "lr", "model", "signature")
    now = {"epochs": 3, "lr": 0.0011, "given": {"lr": 0.003}, "model": "m", "signature": "s"}
    older = {"config": {"epochs": 3, "lr": 0.0007, "model": "m", "signature": "s"}}  # its lr: the used one
    assert storage.differing_keys(older, now, keys) == []
    assert storage.differing_keys({"config": {**older["config"], "epochs": 5}}, now, keys) == ["epochs"]
    other_batch = {"config": {**now, "lr": 0.0022, "given": {"lr": 0.003}}}  # the same flag, another batch's LR
    assert storage.differing_keys(other_batch, now, keys) == []
    other_lr = {"config": {**now, "given": {"lr": 0.01}}}
    assert storage.differing_keys(other_lr, now, keys) == ["lr"]
    assert storage.settings_said(other_lr, now, ["lr"]) == "lr=0.01, this run 0.003"
    assert storage.run_differences({"model": "m"}, {"lr": 0.003, "model": "m"}) == []  # an older run record: no lr
    assert storage.run_differences({"lr": 0.01, "model": "m"}, {"lr": 0.003, "model": "m"}) == ["lr"]


def test_a_submission_of_these_rows_comes_first_under_a_deadline_for_every_layout(project_modules, tmp_path, capsys):
    """prediction.hand_in_first, every predict.py's first step under a deadline: on rows no
    submission there holds (Kaggle's hidden rerun), the training prior, or for masks and boxes an
    empty prediction of each of the sample's rows; one that holds them stays; no deadline, nothing."""
    m = project_modules
    out = tmp_path / "out"
    out.mkdir()
    m.storage.write_csv_atomic(pd.DataFrame({"id": ["a"], "x": [0.3], "y": [0.7]}), out / "submission.csv")
    m.serving.write_defaults(out, pd.DataFrame({"id": ["a"], "x": [0.3], "y": [0.7]}), "distribution", "s")
    run = argparse.Namespace(out=out, train="python train.py")
    hidden = pd.DataFrame({"id": ["h1", "h2", "h3"], "x": 0.5, "y": 0.5})
    m.prediction.hand_in_first(argparse.Namespace(deadline=0, submission="submission.csv"), run, hidden)
    assert pd.read_csv(out / "submission.csv")["id"].tolist() == ["a"]  # no deadline: untouched
    args = argparse.Namespace(deadline=time.time() + 60, submission="submission.csv")
    m.prediction.hand_in_first(args, run, hidden)
    first = pd.read_csv(out / "submission.csv")
    assert first.to_dict("list") == {"id": ["h1", "h2", "h3"], "x": [0.3] * 3, "y": [0.7] * 3}
    assert "holds the training prior for all 3 rows until the folds replace it" in capsys.readouterr().out
    m.prediction.hand_in_first(args, run, hidden)  # it holds these rows now: it stays
    assert capsys.readouterr().out == ""

    masks = pd.DataFrame({"id": ["h1", "h1", "h2"], "class": ["c1", "c2", "c1"], "rle": "1 2"})
    m.prediction.hand_in_first(args, run, masks, "rle")  # an (id, class, rle) layout keeps each row's class
    empty = pd.read_csv(out / "submission.csv", keep_default_na=False)
    assert empty.to_dict("list") == {"id": ["h1", "h1", "h2"], "class": ["c1", "c2", "c1"], "rle": ["", "", ""]}
    assert "holds no mask or box for all 3 rows" in capsys.readouterr().out

    # a row per box: the sample's rows are only examples; no row is a submission of no box, and it
    # stays at the deadline (keep said "not a submission for this test set" of train.py's fallback)
    examples = pd.DataFrame({"image_id": ["e1", "e2"], "x": [0, 1], "score": [0.5, 0.5]})
    (out / "submission.csv").unlink()
    m.prediction.hand_in_first(args, run, examples, "box rows")
    assert pd.read_csv(out / "submission.csv").columns.tolist() == ["image_id", "x", "score"]
    assert len(pd.read_csv(out / "submission.csv")) == 0 and "holds no box until" in capsys.readouterr().out
    m.submission.keep(out / "submission.csv", examples, "box rows")
    assert "kept: no fold finished before the deadline" in capsys.readouterr().out
    with pytest.raises(m.errors.RunError, match="not a submission for this test set"):
        m.submission.keep(out / "submission.csv", examples)  # the rows kinds' check: 0 rows, 2 in the sample


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_a_child_whose_parent_died_as_it_started_ends_itself(project_modules, sig):
    """A train.py killed while its DataLoader workers started (run.py's restart test kills it right
    after a fold) left a worker asleep for good: the kill came before its parent-death signal was
    set, and torch's own check took the new parent (init) for its own. The orphan held the run's
    stdout, and the test reading it hung for 12 minutes. orphans.die_with_parent(parent, sig) now
    ends it, for the loader workers (SIGKILL) and for run.py's children and the fold and tune
    workers (SIGTERM), which had the same race. A child whose parent lives goes on. The starter's
    Python SIGTERM handler, copied by the fork, no longer catches it before exec (a full suite's
    worker had one: the child lived on)."""
    import select

    die_with_parent, signum = project_modules.orphans.die_with_parent, getattr(signal, sig)
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the process that starts the worker, gone as the worker starts
        parent = os.getpid()
        if os.fork() == 0:  # the worker, with its starter's Python handler (train.py's asks for a stop, no more)
            signal.signal(signal.SIGTERM, lambda *_: None)
            try:
                while os.getppid() == parent:  # its parent is killed before its start runs
                    time.sleep(0.01)
                die_with_parent(parent, signum)
            finally:
                os.write(write_end, b"alive")  # an orphan that lives on
                os._exit(0)
        os._exit(0)
    os.close(write_end)
    os.waitpid(child, 0)
    ready, _, _ = select.select([read_end], [], [], 30)
    said = os.read(read_end, 16) if ready else b"(no end in 30 s)"
    os.close(read_end)
    assert said == b"", said  # the pipe closed with no word: the worker was killed at once

    alive = subprocess.run(
        [sys.executable, "-c", "print('went on')"],
        preexec_fn=functools.partial(die_with_parent, os.getpid(), signum),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (alive.returncode, alive.stdout) == (0, "went on\n")


def test_a_cache_the_disk_cannot_hold_is_held_in_memory(project_modules, tmp_path, monkeypatch, capsys):
    """caches.py: a cache that would leave less than HEADROOM on its disk (here: any disk) is filled
    in memory, read back by the process's later calls, and leaves no file; one made ahead (train.py's
    test images, for predict.py) is not made; one the memory cannot hold either goes on the disk all
    the same (it fits there: the run trains, as before)."""
    caches = project_modules.caches
    shape, want = (4, 8, 8, 3), np.arange(4 * 8 * 8 * 3).reshape(4, 8, 8, 3).astype(np.uint8)

    def fill(arr):
        arr[:] = want
        return {"bad": [2]}

    monkeypatch.setattr(caches, "HELD", {})
    monkeypatch.setattr(caches, "HEADROOM", caches.shutil.disk_usage(tmp_path).free + 1)
    data, meta = tmp_path / "train_8px.u8", tmp_path / "train_8px.json"
    arr = caches.write_memmap(data, meta, shape, "k1", fill)
    assert not isinstance(arr, np.memmap) and (arr == want).all() and not arr.flags.writeable
    assert list(tmp_path.iterdir()) == []  # no cache file, no meta, no temporary file
    out = capsys.readouterr().out
    assert re.search(
        r"^WARNING: \S+/train_8px\.u8: too little disk \([\d.]+ MB free there; this cache needs 0\.0 MB and \d+ MB "
        r"stay free for checkpoints\): held in memory by this process instead; free disk space there, or pass",
        out,
        re.M,
    ), out
    assert caches.held_in(arr, data) == "memory (too little disk)"
    again, found = caches.read_memmap(data, meta, shape, "k1")  # predict.py's next fold: no second decode
    assert again is arr and found == {"bad": [2]}
    assert caches.read_memmap(data, meta, shape, "k2") == (None, {})  # other files: decoded again
    ahead = caches.write_memmap(tmp_path / "test_8px.u8", tmp_path / "test_8px.json", shape, "k3", fill, memory=False)
    assert ahead is None and list(tmp_path.iterdir()) == []
    assert re.search(r"^CACHE: \S+/test_8px\.u8: not made ahead, too little disk .*predict\.py decodes them itself$",
                     capsys.readouterr().out, re.M)  # fmt: skip
    monkeypatch.setattr(caches, "MEMORY_SHARE", 0.0)  # memory that cannot hold it either: the disk all the same
    all_the_same = caches.write_memmap(data, meta, shape, "k4", fill)
    assert isinstance(all_the_same, np.memmap) and (all_the_same == want).all()
    assert re.search(
        r"^WARNING: \S+/train_8px\.u8: too little disk .*, and [\d.]+ MB of memory is available: on the disk all the "
        r"same, the checkpoints get the rest$",
        capsys.readouterr().out,
        re.M,
    )
    monkeypatch.setattr(caches, "HEADROOM", 0)  # room: on the disk, as ever
    on_disk = caches.write_memmap(data, meta, shape, "k5", fill)
    assert isinstance(on_disk, np.memmap) and (on_disk == want).all() and caches.held_in(on_disk, data) == str(data)
    assert caches.read_memmap(data, meta, shape, "k5")[1]["bad"] == [2]


SPACE_REFUSED = """
import errno, resource, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from machinery import caches, storage
caches.HEADROOM = 0  # the free space looks enough; the file system refuses the blocks (a race, a quota, ulimit -f)
resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
arr = caches.write_memmap(caches.Path(sys.argv[2]) / "big.u8", caches.Path(sys.argv[2]) / "big.json", (4, 128, 128, 3),
                          "k", lambda a: a.fill(7))
print("held", type(arr).__name__, int(arr.sum() == 7 * arr.size))
caches.MEMORY_SHARE = 0.0  # and the memory cannot hold it: nowhere, one line
try:
    caches.write_memmap(caches.Path(sys.argv[2]) / "big2.u8", caches.Path(sys.argv[2]) / "big2.json", (4, 128, 128, 3),
                        "k", lambda a: a.fill(7))
except caches.RunError as e:
    print("RunError", e)
try:
    storage.torch_save({"w": __import__("torch").zeros(100_000)}, caches.Path(sys.argv[2]) / "ckpt.pth")
except OSError as e:
    print("torch_save", errno.errorcode[e.errno])
"""


def test_a_disk_that_refuses_a_caches_blocks_or_a_checkpoints_bytes_says_so(project_modules, tmp_path):
    """The file system's own refusal, for real: a file-size limit (RLIMIT_FSIZE) makes fallocate and
    write fail as a full disk does (EFBIG for ENOSPC), in a process of its own. The cache is held in
    memory (np.memmap's ftruncate raised before); torch_save raises the OSError, where torch.save
    raised RuntimeError("unexpected pos") and atomic_write could not tell a full disk."""
    project = Path(project_modules.caches.__file__).parents[1]
    r = subprocess.run(
        [sys.executable, "-c", SPACE_REFUSED, str(project), str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "held ndarray 1" in r.stdout and "torch_save EFBIG" in r.stdout, r.stdout + r.stderr[-2000:]
    assert "big.u8: too little disk" in r.stdout and not [p for p in tmp_path.iterdir() if "big" in p.name]
    assert re.search(
        r"^RunError \S+/big2\.u8: too little disk .*, and [\d.]+ MB of memory is available: free disk", r.stdout, re.M
    )


TABLE_REFUSED = """
import resource, sys
sys.path.insert(0, sys.argv[1])
from machinery import experiments
table = experiments.Path(sys.argv[2]) / "experiments.csv"
experiments.append(table, {"run": "r1", "model": "m", "stop": "running (pid 1)"})
resource.setrlimit(resource.RLIMIT_FSIZE, (table.stat().st_size + 10, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
experiments.append_or_say(table, {"run": "r1", "model": "m", "stop": "done", "fold_scores": "0.1 " * 50}, "says X")
print("went on")
"""


def test_an_experiments_row_the_disk_refuses_is_one_warning(project_modules, tmp_path):
    """The table is the run's record, not its work: a run that had trained every fold ended as failed
    when the disk refused its row (engine.finish, the boosters), and a table's predict.py failed
    before its submission (the blend's row). A real refusal: a file-size limit, in a process of its own."""
    project = Path(project_modules.experiments.__file__).parents[1]
    r = subprocess.run(
        [sys.executable, "-c", TABLE_REFUSED, str(project), str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr[-3000:]
    said = r"^WARNING: this run's row of experiments\.csv says X: \[Errno 27\] File too large"
    assert re.search(said, r.stdout, re.M), r.stdout
    assert r.stdout.rstrip().endswith("went on") and "running (pid 1)" in (tmp_path / "experiments.csv").read_text()


KEPT_LOGS = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from machinery import logs
tmp = Path(sys.argv[2])
logs.keep_log(tmp / "not made" / "predict.log")  # predict.py on a folder nothing wrote
(tmp / "refused" / "run.log").mkdir(parents=True)  # a name the file cannot take
logs.keep_log(tmp / "refused" / "run.log")
logs.keep_log(tmp / "run.log")
print("RUN: handed in it")
print("RUN FAILED: not really", file=sys.stderr)
"""


def test_run_py_and_predict_py_keep_their_lines_where_the_folder_takes_them(project_modules, tmp_path):
    """run.log and predict.log (logs.keep_log): what was handed in, kept where a closed terminal took the
    console. A folder that is not there is not made; a file it refuses is one WARNING and the run goes on."""
    project = Path(project_modules.logs.__file__).parents[1]
    r = subprocess.run(
        [sys.executable, "-c", KEPT_LOGS, str(project), str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert not (tmp_path / "not made").exists()
    refused = f"WARNING: {tmp_path / 'refused' / 'run.log'}: Is a directory; this log is in the console only"
    assert r.stdout.splitlines() == [refused, "RUN: handed in it"], r.stdout
    assert (tmp_path / "run.log").read_text() == "RUN: handed in it\nRUN FAILED: not really\n"


def test_a_full_disks_room_comes_from_the_runs_cache_alone(project_modules, tmp_path):
    """room.free_cache, which gives a refused submission or checkpoint its room (tests/test_bad_input.py's case
    d, on a real full disk): the files of out/cache go (a checkpoint's: the test set's alone), a live writer's
    temporary file stays, and a cache tune.py's trials share (a link to the search's) is not this run's to remove."""
    room = project_modules.room
    out, cache = tmp_path / "out", tmp_path / "out" / "cache"
    cache.mkdir(parents=True)
    for name in ("train_64px.u8", "train_64px.json", "tokens-test-0123.npz", "test_16000hz_5s.i16", "masks_64px.u8"):
        (cache / name).write_bytes(bytes(4096))
    live = cache / f".test_64px.u8.{os.getpid()}.k3j_x9a1.tmp"  # this process is writing it
    live.write_bytes(b"x")
    said = room.free_cache(out, ahead=True)  # a checkpoint's room: the test set's caches alone (train.py's is in use)
    assert re.fullmatch(rf"removed the test set's cache {re.escape(str(cache))} \(2 file\(s\), .*", said), said
    kept = [live.name, "masks_64px.u8", "train_64px.json", "train_64px.u8"]
    assert sorted(p.name for p in cache.iterdir()) == sorted(kept)
    said = room.free_cache(out)
    assert re.fullmatch(rf"removed the cache {re.escape(str(cache))} \(3 file\(s\), [\d.]+ MB; .*", said), said
    assert [p.name for p in cache.iterdir()] == [live.name]
    trial = tmp_path / "trial"
    trial.mkdir()
    (trial / "cache").symlink_to(cache, target_is_directory=True)
    (cache / "test_64px.u8").write_bytes(bytes(10))
    assert room.free_cache(trial) is None and (cache / "test_64px.u8").exists()
    assert room.free_cache(tmp_path / "no_cache_here") is None


def test_image_files_name_the_line_each_id_came_from(project_modules, tmp_path):
    """A table with a row per image and class lists an image on several lines: a missing image's
    error named its place among the images (line 3 for line 5); each id's own line now."""
    images, errors = project_modules.images, project_modules.errors
    (tmp_path / "a.png").write_bytes(b"x")
    assert images.image_files(tmp_path, ["a"], ".png", "train.csv") == [str(tmp_path / "a.png")]
    with pytest.raises(errors.DataError, match=r"b\.png: image not found \(train\.csv line 5\)"):
        images.image_files(tmp_path, ["a", "b"], ".png", "train.csv", [2, 5])
    with pytest.raises(errors.DataError, match=r"b\.png: image not found \(train\.csv line 3\)"):
        images.image_files(tmp_path, ["a", "b"], ".png", "train.csv")  # a row per id: line k + 2
    with pytest.raises(errors.DataError, match=r"^train\.csv line 7: id '\.\./x' points outside"):
        images.image_files(tmp_path, ["a", "../x"], ".png", "train.csv", [2, 7])
    assert images.image_files(tmp_path, ["a", "b"], ".png", "test.csv", [2, 5], test=True)[1].endswith("b.png")


def test_an_image_under_another_extension_is_read_as_it_is(project_modules, tmp_path, capsys):
    """A test/ of .png beside a train/ of .jpg (--image-ext .jpg): every test image was "not found",
    and the run stopped at its preflight. An image missing under --image-ext but there under
    another image extension is read from there, with one line; one missing under every extension
    still stops a training set. Ids that name their own extension, of several kinds (im0.png, im5.jpg:
    kagtpl new took .jpg from the first id), looked for im5.png.jpg and stopped the run."""
    images, errors = project_modules.images, project_modules.errors
    for name in ("a.jpg", "b.png", "c.tif", "d.1.png", "e.png"):
        (tmp_path / name).write_bytes(b"x")
    ids = ("a", "b", "c.jpg", "d.1", "e.png")
    paths = [images.image_path(tmp_path, i, ".jpg", f"line {k}") for k, i in enumerate(ids)]
    images.check_images_exist(paths, "sample_submission.csv", test=True)
    assert paths == [str(tmp_path / n) for n in ("a.jpg", "b.png", "c.tif", "d.1.png", "e.png")]
    said = capsys.readouterr().out
    assert "WARNING: 4 of 5 images (sample_submission.csv) are .png, .tif, not --image-ext: read as they are" in said
    with pytest.raises(errors.DataError, match=r"f\.jpg: image not found \(labels\.csv line 3\)"):
        images.check_images_exist([str(tmp_path / "a.jpg"), str(tmp_path / "f.jpg")], "labels.csv")

    import cv2  # serve.py's batch, decoded with no check before: a .png named .jpg was a blank image

    cv2.imwrite(str(tmp_path / "white.png"), np.full((8, 8, 3), 255, np.uint8))
    pixels = images.decode_images([str(tmp_path / "white.jpg"), str(tmp_path / "none.jpg")], ["w", "n"], 8, "served")
    assert pixels[0].min() == 255 and pixels[1].max() == 0, pixels.reshape(2, -1).max(axis=1)


def test_ensemble_leaves_out_a_diverged_fold_and_never_writes_nan(project_modules, capsys):
    ensemble, errors = project_modules.submission.ensemble, project_modules.errors
    good, diverged = np.array([[0.2, 0.8], [0.5, 0.5]]), np.array([[0.2, 0.8], [np.nan, np.nan]])
    mean, folds = ensemble([good, diverged], ["a", "b"])
    np.testing.assert_allclose(mean, good)
    assert folds == 1
    assert "model 2 of 2 predicts non-finite values (1 rows, first id 'b')" in capsys.readouterr().out
    values = np.array([[1.5], [np.inf]])
    with pytest.raises(errors.RunError, match="no checkpoint gave usable predictions"):
        ensemble([values], ["a", "b"], normalize=False)
    np.testing.assert_allclose(ensemble([np.array([[2.0]]), np.array([[4.0]])], ["a"], normalize=False)[0], [[3.0]])


def test_fold_mean_is_a_running_sum_of_one_array_in_the_dtype_asked(project_modules, capsys):
    """segmentation's predict.py adds each fold's probabilities (images x classes x H x W) to one
    float32 sum instead of keeping every fold; a diverged fold is still left out by name."""
    rng = np.random.default_rng(0)
    folds = [rng.random((3, 1, 4, 4), dtype=np.float32) for _ in range(3)]
    fold_mean = project_modules.submission.FoldMean(["a", "b", "c"], 4, np.float32)
    first = folds[0].copy()
    for pred in folds:
        fold_mean.add(pred)
    fold_mean.add(np.where(np.arange(3)[:, None, None, None] == 2, np.nan, folds[0]))
    mean, count = fold_mean.mean(normalize=False)
    np.testing.assert_allclose(mean, np.mean(folds, axis=0), rtol=1e-6)
    assert count == 3 and fold_mean.seen == 4 and mean.dtype == np.float32
    np.testing.assert_array_equal(folds[0], first)  # the first fold is copied, never summed into
    assert "model 4 of 4 predicts non-finite values (1 rows, first id 'c')" in capsys.readouterr().out


def test_image_cache_names_the_bad_file_and_reuses_the_cache(project_modules, tmp_path, digits_dir):
    images, errors = project_modules.images, project_modules.errors
    good = sorted((digits_dir / "train").glob("*.jpg"))[:3]
    paths = [str(p) for p in good]
    arr = images.image_cache(paths, ["l2", "l3", "l4"], 16, tmp_path / "cache", "train", 0)
    assert arr.shape == (3, 16, 16, 3) and arr.dtype == np.uint8 and arr.max() > 0
    mtime = (tmp_path / "cache" / "train_16px.u8").stat().st_mtime_ns
    images.image_cache(paths, ["l2", "l3", "l4"], 16, tmp_path / "cache", "train", 0)
    assert (tmp_path / "cache" / "train_16px.u8").stat().st_mtime_ns == mtime  # read, not rebuilt
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"not a jpeg")
    with pytest.raises(
        errors.DataError, match=r"broken\.jpg: missing or cannot be decoded as an image \(labels.csv line 9\)"
    ):
        images.image_cache([*paths, str(bad)], ["a", "b", "c", "labels.csv line 9"], 16, tmp_path / "cache", "x", 0)


def test_experiments_table_appends_and_ranks_by_cv_in_the_metrics_direction(project_modules, tmp_path):
    exp = project_modules.experiments
    path = tmp_path / "experiments.csv"
    for model, metric, higher, cv in [
        ("a", "Acc", True, "0.91"),
        ("b", "Acc", True, "0.95"),
        ("c", "rmse", False, "3.2"),
        ("d", "rmse", False, "2.9"),
        ("e", "Acc", True, ""),  # a run with no score yet (no fold finished)
    ]:
        exp.append(path, {"model": model, "metric": metric, "higher_is_better": higher, "cv": cv})
    rows = exp.read(path)
    assert [r["model"] for r in rows] == ["a", "b", "c", "d", "e"] and all(r["time"] for r in rows)
    assert [r["model"] for r in exp.ranked(rows)] == ["b", "a", "e", "d", "c"]
    assert not list(tmp_path.glob(".*.tmp"))  # written through a temporary file
    with pytest.raises(ValueError, match="not experiment columns"):
        exp.append(path, {"modle": "typo"})
    assert len(exp.read(path)) == 5  # the bad row changed nothing


def test_no_runs_yet_gives_the_train_py_command_that_records_one_there(project_modules, tmp_path, monkeypatch, capsys):
    """`python -m machinery.experiments` on a folder with no run, in a project with none elsewhere:
    the command that records one in that folder (it said "run train.py", which records in output/)."""
    monkeypatch.setattr(project_modules.hardware, "PROJECT", tmp_path.resolve())  # a project with no runs at all
    monkeypatch.chdir(tmp_path)
    project_modules.experiments.main(["--out-dir", "exp 9"])
    said = capsys.readouterr().out
    assert said == "no runs recorded yet in exp 9/experiments.csv: run python train.py --out-dir 'exp 9'\n", said
    project_modules.experiments.main([])
    assert capsys.readouterr().out == "no runs recorded yet in output/experiments.csv: run python train.py\n"


def test_a_runs_row_is_written_when_it_starts_and_says_how_it_ended(project_modules, tmp_path):
    """The row written at the start (running (pid N)) is replaced by the end's (same run and
    model); a run whose process is gone without an end reads back as killed; an exception's
    type and first line are its stop."""
    exp = project_modules.experiments
    path = tmp_path / "experiments.csv"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    exp.append(path, {"run": "r1", "model": "resnet18", "stop": f"running (pid {dead.pid})"})
    exp.append(path, {"run": "r2", "model": "resnet18", "stop": exp.running()})
    exp.append(path, {"run": "r2", "model": "lgbm", "stop": exp.running()})
    exp.append(path, {"run": "r2", "model": "resnet18", "cv": "0.5", "stop": "done"})
    rows = exp.read(path)
    assert [(r["run"], r["model"], r["stop"]) for r in rows] == [
        ("r1", "resnet18", "killed (ended without a result)"),
        ("r2", "resnet18", "done"),
        ("r2", "lgbm", exp.running()),  # this process: still running
    ]
    assert exp.failure(ValueError("bad row 7\nmore")) == "failed: ValueError: bad row 7"
    assert exp.failure(KeyboardInterrupt()) == "interrupted"


def test_fold_clock_drops_tta_first_then_folds_best_first(project_modules, capsys):
    submission = project_modules.submission
    now = [0.0]
    clock = submission.FoldClock(deadline=45.0, views=2, clock=lambda: now[0])
    checkpoints = [("f0", {"val_loss": 0.5}), ("f1", {"val_loss": 0.2}), ("f2", {}), ("f3", {"val_loss": 0.3})]
    assert [name for name, _ in clock.best_first(checkpoints)] == ["f1", "f3", "f0", "f2"]
    used = []
    for name, _ in clock.folds(checkpoints):  # as predict.py drives it
        now[0] += 10.0 * clock.views  # 10 s per view of the test set
        used.append((name, clock.views))
    # after f1 (20 s with TTA): 4 folds x 20 s > 22 s left -> TTA off; f3, f0 at 10 s; f2 would end past 45 - 3
    assert used == [("f1", 2), ("f3", 1), ("f0", 1)]
    out = capsys.readouterr().out
    assert "22s left before the deadline: TTA off" in out and "PREDICT: deadline: 3 of 4 fold(s) used" in out
    unhurried = submission.FoldClock(deadline=0, views=2, clock=lambda: 1e9)
    assert unhurried.best_first(checkpoints) == checkpoints and unhurried.next_fold(3, 4) and unhurried.views == 2


def test_fold_clock_leaves_the_first_folds_warm_up_out_of_the_next_folds_price(project_modules, capsys):
    """Issue 57, item 9: predict.py dropped TTA after its first checkpoint ("16 s left ... TTA off",
    then done in 9.7 s) because the first fold's time, its one-time warm-up included, was taken as
    the rate. 3 folds of 1000 rows in batches of 100, 0.001 s a row and view, a 6 s warm-up in the
    first fold's first batch: the first fold took 8 s, a fold takes 2 s with both views."""
    submission = project_modules.submission
    now = [0.0]
    clock = submission.FoldClock(deadline=20.0, views=2, clock=lambda: now[0])
    views = []
    for k, _ in enumerate(clock.folds([("f0", {}), ("f1", {}), ("f2", {})])):
        views.append(clock.views)
        for rows in range(100, 1001, 100):
            now[0] += (6.0 if k == 0 and rows == 100 else 0.0) + 100 * clock.views * 0.001
            assert clock.batch_done(rows, 1000)
    assert views == [2, 2, 2] and abs(now[0] - 12.0) < 1e-9  # every fold with TTA, 8 s before the deadline
    assert "TTA off" not in capsys.readouterr().out


def test_fold_clock_measures_its_rate_inside_a_fold_then_drops_tta_then_stops_the_fold(project_modules, capsys):
    """A test set larger than any measured before: the first fold's own batches give the rate.
    10 batches of 100 rows; each view of a row costs 0.01 s; the first batch's time (warm-up)
    is not in the rate."""
    submission = project_modules.submission
    now = [0.0]
    clock = submission.FoldClock(deadline=21.0, views=2, clock=lambda: now[0])
    assert clock.next_fold(0, 3)
    seen = []
    for rows in range(100, 1001, 100):
        now[0] += (5.0 if rows == 100 else 0.0) + 100 * clock.views * 0.01  # a 5 s warm-up on the first
        seen.append(clock.views)
        if not clock.batch_done(rows, 1000):
            break
    # after batch 2 (t=9): 800 rows x 2 views x 0.01 = 16 s > 21 - 9 - 3 s left -> TTA off; 8 s fits: it goes on
    assert seen[:3] == [2, 2, 1] and not clock.cut and len(seen) == 10
    assert "PREDICT: 200 of 1000 rows at 100 rows/s: TTA off for the rest" in capsys.readouterr().out
    clock.fold_done()
    assert not clock.next_fold(1, 3)  # the fold took 17 s, 1 s is left: a second does not fit
    late = submission.FoldClock(deadline=12.0, views=1, clock=lambda: now[0])
    now[0] = 0.0
    assert late.next_fold(0, 1)
    now[0] += 1.0
    assert late.batch_done(100, 1000)  # one batch: no rate yet
    now[0] += 1.0
    assert not late.batch_done(200, 1000) and late.cut  # 800 x 0.01 = 8 s > 12 - 2 - 3 left
    assert "this fold would not finish (200 of 1000 rows predicted): left out" in capsys.readouterr().out
    assert not late.next_fold(1, 2)  # nothing more after a cut fold
    # under run.py (--after-train) the first fold runs on past the deadline: cutting it hands in the
    # fallback (a 3-fold detection run on an H100), and run.py's stop at the budget is the limit
    ran_on = submission.FoldClock(deadline=12.0, views=1, clock=lambda: now[0], hard_stop=True)
    now[0] = 0.0
    assert ran_on.next_fold(0, 2)
    for rows in (100, 200, 1000):
        now[0] += 1.0 if rows < 1000 else 20.0  # 22 s: long past 12 - 3
        assert ran_on.batch_done(rows, 1000) and not ran_on.cut
    ran_on.fold_done()
    assert not ran_on.next_fold(1, 2)  # one fold is in hand: the second does not start
    second = submission.FoldClock(deadline=12.0, views=1, clock=lambda: now[0], hard_stop=True)
    now[0] = 0.0
    assert second.next_fold(1, 2)  # a second fold, started in time: the deadline holds for it
    now[0] = 1.0
    assert second.batch_done(100, 1000)
    now[0] = 2.0
    assert not second.batch_done(200, 1000) and second.cut
    assert submission.FoldClock(deadline=0, views=2).batch_done(1, 10)  # no deadline: never stops
    now[0] = 99.0  # past the deadline, the fold's last batch done: the fold is kept
    assert submission.FoldClock(deadline=12.0, views=1, clock=lambda: now[0]).batch_done(50, 50)


@pytest.mark.parametrize(
    "config, classes, y, expected",
    [
        ({"problem": "multiclass", "submission": "probs"}, ["a", "b", "c"], [0, 0, 1, 2], {"a": 0.5, "b": 0.25}),
        ({"problem": "multiclass", "submission": "label"}, ["a", "b", "c"], [2, 0, 2, 1], {"label": "c"}),
        ({"problem": "binary", "submission": "probs"}, ["0", "1"], [0, 1, 1, 1], {"label": 0.75}),
        ({"problem": "regression", "submission": "probs", "metric": "rmsle"}, [], np.log1p([1.0, 3.0]), None),
        # MAE's best constant is the median (1.0 here: MAE 33.7 against the mean's 40.2); it was the mean
        ({"problem": "regression", "submission": "label", "metric": "mae"}, [], [0.0, 1.0, 100.0], {"label": 1.0}),
        # multilabel (Jigsaw): each label's share, not a distribution over them (the class count's bincount failed)
        (
            {"problem": "multilabel", "submission": "probs"},
            ["toxic", "threat"],
            np.array([[1, 0], [1, 1], [0, 0], [0, 0]], np.float32),
            {"toxic": 0.5, "threat": 0.25},
        ),
    ],
)
def test_the_fallback_submission_is_the_training_prior_and_passes_the_check(
    project_modules, tmp_path, capsys, config, classes, y, expected
):
    submission = project_modules.submission
    columns = config["submission"] == "probs" and config["problem"] in ("multiclass", "multilabel")
    cols = ["id", *classes] if columns else ["id", "label"]
    sample = pd.DataFrame({c: ["x", "y"] if c == "id" else [0, 0] for c in cols})
    path = tmp_path / "submission.csv"
    submission.write_fallback(path, sample, np.asarray(y), config, classes)
    sub = pd.read_csv(path, dtype={"id": str})
    assert list(sub.columns) == cols and list(sub["id"]) == ["x", "y"]
    if expected is None:  # rmsle: the mean of log1p(y), back through expm1 as predict.py does
        assert np.allclose(sub["label"], np.expm1(np.log1p([1.0, 3.0]).mean()))
    for col, value in (expected or {}).items():
        assert (sub[col] == value).all() if isinstance(value, str) else np.allclose(sub[col], value)
    said = capsys.readouterr().out
    assert "is a fallback" in said and ("the training median" in said) == (config.get("metric") == "mae")
    # a submission already there is an earlier run's: moved aside, and this run's fallback written
    fallback = path.read_text()
    path.write_text("an earlier run's file\n")
    submission.write_fallback(path, sample, np.asarray(y), config, classes)
    assert path.read_text() == fallback and "moved to" in capsys.readouterr().out
    assert (tmp_path / "submission.earlier.csv").read_text() == "an earlier run's file\n"
    # one written since the run's start is this run's (a train.py run.py started again): replaced where
    # it is; moved, it took the place of the earlier run's file
    path.write_text("this run's first fallback\n")
    submission.write_fallback(path, sample, np.asarray(y), config, classes, since=path.stat().st_mtime)
    assert path.read_text() == fallback and "moved to" not in capsys.readouterr().out
    assert (tmp_path / "submission.earlier.csv").read_text() == "an earlier run's file\n"
    submission.keep(path, sample)  # predict.py with no fold in time keeps it
    with pytest.raises(project_modules.errors.RunError, match="other ids"):
        submission.keep(path, sample.assign(id=["x", "z"]))


def test_channels_last_inputs_meet_channels_last_weights_on_cpu(project_modules):
    """The engine moves 4-D batches (uint8 images too) to NHWC when the machine is channels_last;
    the device-side normalize keeps NHWC, and the model (made NHWC by the engine and predict.py)
    gives what the contiguous model gives."""
    m = project_modules
    device = torch.device("cpu")
    machine = m.engine.make_machine(device, "off", {}, channels_last=False)
    machine.channels_last = True  # the CUDA setting, on CPU
    images = torch.randint(0, 255, (4, 3, 32, 32), dtype=torch.uint8)
    x, y = m.steps.to_device((images, torch.arange(4)), machine)
    assert x.dtype == torch.uint8 and x.is_contiguous(memory_format=torch.channels_last)
    assert not y.is_contiguous(memory_format=torch.channels_last) or y.dim() != 4  # targets untouched
    xn = m.train.normalize(x)
    assert xn.dtype == torch.float32 and xn.is_contiguous(memory_format=torch.channels_last)
    model = m.train.build_model({"model": "resnet18"}, 3).eval()
    reference = model(m.train.normalize(images))
    nhwc = model.to(memory_format=torch.channels_last)
    assert nhwc.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(nhwc(xn), reference, rtol=1e-4, atol=1e-4)
    # the mean and std are ImageNet's: a mid-grey image normalizes to about (0.5 - mean) / std
    grey = m.train.normalize(torch.full((1, 3, 2, 2), 128, dtype=torch.uint8))
    torch.testing.assert_close(
        grey[0, :, 0, 0], (128 / 255 - torch.tensor(m.images.IMAGENET_MEAN)) / torch.tensor(m.images.IMAGENET_STD)
    )


def test_the_fold_loop_holds_one_model_at_a_time_skips_unfit_weights_and_ends_at_the_deadline(project_modules):
    """prediction.each_fold, every predict.py's loop: a fold whose weights do not fit (restore: None)
    is skipped, the last fold's model is gone before the next is restored (one model in memory at a
    time: test_bounded's cap holds half the checkpoints), and a fold the deadline stopped (None)
    ends the loop with what was done."""
    m = project_modules
    checkpoints = [(Path(f"model_fold{k}.pth"), {"fold": k}) for k in range(5)]
    alive, predicted = [], []

    class Model:
        pass

    def restore(path, ckpt):
        assert all(ref() is None for ref in alive), f"a model is still in memory when {path.name} loads"
        if ckpt["fold"] == 1:
            return None
        model = Model()
        alive.append(weakref.ref(model))
        return model

    def predict_fold(path, ckpt, model):
        predicted.append(ckpt["fold"])
        return None if ckpt["fold"] == 3 else 10 * ckpt["fold"]

    clock = m.submission.FoldClock(None, views=1)
    assert m.prediction.each_fold(checkpoints, clock, restore, predict_fold) == [0, 20]
    assert predicted == [0, 2, 3] and all(ref() is None for ref in alive)


def test_folds_past_the_deadline_keep_the_submission_unless_run_py_stops_them(project_modules, tmp_path, capsys):
    """prediction.Folds, every predict.py's folds under its deadline: past it, the first fold's first
    batch stops the fold, predict() answers None and keep() leaves train.py's fallback in place (a
    file that is not this test set's submission: one clear error); started by run.py (supervised),
    whose own stop is the limit, the first fold runs on and is handed in; the table's MLP
    (hard_stop=False), whose trees still run after it, stops as a lone predict.py does."""
    m = project_modules
    sample = pd.DataFrame({"id": ["1", "2", "3", "4"], "label": [0, 1, 0, 1]})  # ids as text, as read
    sample.to_csv(tmp_path / "submission.csv", index=False)
    checkpoints = [(tmp_path / f"model_fold{k}.pth", {"fold": k, "val_loss": k}) for k in range(2)]
    args = argparse.Namespace(deadline=time.time() - 60, submission="submission.csv")

    def started(supervised: bool):
        cpu = torch.device("cpu")
        return m.prediction.Start(supervised, cpu, tmp_path, tmp_path, checkpoints, {}, [0, 1], "python train.py")

    def predict_fold(folds, path, ckpt, model):
        for rows in (1, 2, 4):  # a test set of 4 rows in 3 batches
            if not folds.on_batch(rows):
                return None
        return ckpt["fold"]

    for supervised, hard_stop in ((False, True), (True, False)):
        folds = m.prediction.Folds(args, started(supervised), 4, hard_stop=hard_stop)
        assert folds.predict(functools.partial(predict_fold, folds), restore=lambda p, c: object()) is None
        folds.keep(sample)
        assert "SUBMISSION: " + str(tmp_path / "submission.csv") + " kept" in capsys.readouterr().out
    folds = m.prediction.Folds(args, started(True), 4)
    assert folds.predict(functools.partial(predict_fold, folds), restore=lambda p, c: object())[0] == 0
    (tmp_path / "submission.csv").write_text("id,label\n9,0\n")
    with pytest.raises(m.errors.RunError, match="not a submission for this test set"):
        folds.keep(sample)


def augmented_batches(m, workers: int) -> list[np.ndarray]:
    """The image task's training batches of 8 copies of one picture, after torch.manual_seed(0):
    what differs between two of them is the augmentation's draws alone."""
    cache = np.random.default_rng(1).integers(0, 255, (1, 32, 32, 3), dtype=np.uint8).repeat(8, axis=0)
    rows = m.train.ImageDataset(cache, np.arange(8), np.zeros(8, np.int64), m.train.make_transforms(32, True, True))
    settings = {"num_workers": workers, "prefetch_factor": 2 if workers else None, "persistent_workers": False}
    torch.manual_seed(0)
    return [x.numpy() for x, _ in m.images.make_loader(rows, 2, True, settings)]


@pytest.mark.parametrize("workers", [0, 2])
def test_the_same_seed_augments_the_same_and_each_loader_worker_and_rank_draws_its_own(
    project_modules, workers, monkeypatch
):
    """albumentations 2 draws from each Compose's own generator, out of numpy's and torch's seeds:
    two runs with one --seed trained on different crops, and every DataLoader worker started as a
    copy of the same generator (worker 0's batches were worker 1's). make_loader and worker_init
    seed it from torch's generator, as DataLoader seeds each worker."""
    first, again = augmented_batches(project_modules, workers), augmented_batches(project_modules, workers)
    assert len(first) == 4 and all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert len({b.tobytes() for b in first}) == 4  # worker 0 yields batches 0 and 2, worker 1 batches 1 and 3
    # DDP's ranks all start from --seed: rank 1 (parallel.rank, as torch.distributed gives it) draws its own
    monkeypatch.setattr(project_modules.images, "rank", lambda: 1)
    other = augmented_batches(project_modules, workers)
    assert not any(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


class SlowRows(torch.utils.data.Dataset):
    """Rows 0..23, each its own index, read at 20 ms a row: a pass long enough to kill a worker in;
    row `bad` raises, as a dataset's own error does."""

    def __init__(self, bad: int = -1):
        self.bad = bad

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> int:
        if i == self.bad:
            raise ValueError(f"row {i} is bad")
        time.sleep(0.02)
        return i


@pytest.mark.slow
def test_a_killed_loader_workers_pass_goes_on_in_order_on_half_the_workers(project_modules, capsys, monkeypatch):
    """RestartingLoader (machinery/loader_restarts.py): a worker SIGKILLed mid-pass, then one of the
    persistent pool killed between two passes: each pass still reads every row once, in order
    (predict.py's rows and their predictions stay aligned), on half the workers each time, with one
    WARNING each. A dataset's own error comes through as itself."""
    restarting = project_modules.loader_restarts.RestartingLoader
    # torch looks for a dead worker each time a batch has not come in MP_STATUS_CHECK_INTERVAL (5 s: ~5 s of
    # this test's waiting a kill, ~15 s in all); 0.5 s here, where what is checked is what the pass does once
    # torch has raised (a default argument, bound when torch defined the method)
    iterator = torch.utils.data.dataloader._MultiProcessingDataLoaderIter
    monkeypatch.setattr(iterator._try_get_data, "__defaults__", (0.5,))
    # as the scripts make them: 2 persistent workers, their socket folder made first (a killed worker's
    # own would stay in /tmp: loader_sockets.py)
    settings = project_modules.hardware.flag_loader(2, "cpu")
    loader = restarting(SlowRows(), batch_size=2, **settings)
    rows = []
    for k, batch in enumerate(loader):
        rows += batch.tolist()
        if k == 3:  # four batches in, more in flight
            os.kill(loader.loader._iterator._workers[0].pid, signal.SIGKILL)
    assert rows == list(range(24))
    said = capsys.readouterr().out
    assert re.fullmatch(
        r"WARNING: DataLoader worker \(pid\(s\) \d+\) (exited unexpectedly|died as it handed over a batch \(\w+\)) "
        r"\(killed: the OOM killer, or a kill -9\): the pass goes on from batch \d+ of 12 on 1 loader worker\(s\), "
        r"not 2\n",
        said,
    ), said
    assert [x for b in loader for x in b.tolist()] == list(range(24))  # a later pass: one worker, a pool of its own
    os.kill(loader.loader._iterator._workers[0].pid, signal.SIGKILL)  # between passes: the pool's worker idles
    assert [x for b in loader for x in b.tolist()] == list(range(24))
    assert "from batch 1 of 12 on 0 loader worker(s), not 1\n" in capsys.readouterr().out
    with pytest.raises(ValueError, match="row 5 is bad"):
        list(restarting(SlowRows(bad=5), batch_size=2, num_workers=2))
    gc.collect()  # the failed pass's workers, held by its traceback's frames: ended now, not at the worker's exit


def test_a_16_bit_scan_keeps_its_gray_levels_and_an_8_bit_image_reads_as_before(project_modules, tmp_path):
    """UW-Madison GI Tract's images are 16-bit PNGs of 12-bit values (0-4095). OpenCV's 8-bit read
    divides by 256: every scan came out 16 levels of gray, 0-15, near black. It is now read at its
    depth and scaled by its own maximum; 8-bit images read bit for bit as before."""
    import cv2

    read = project_modules.images.read_image
    scan = np.tile(np.arange(0, 4096, 4, dtype=np.uint16), (64, 1))  # a 12-bit ramp, 64 x 1024
    cv2.imwrite(str(tmp_path / "scan.png"), scan)
    old = cv2.resize(cv2.imread(str(tmp_path / "scan.png"), cv2.IMREAD_COLOR), (256, 256), interpolation=cv2.INTER_AREA)
    img = read(str(tmp_path / "scan.png"), 256)
    assert img.dtype == np.uint8 and img.shape == (256, 256, 3) and (img[..., 0] == img[..., 2]).all()
    assert old.max() == 15 and len(np.unique(old)) == 16  # what it was
    assert img.max() == 255 and len(np.unique(img)) == 256, np.unique(img)
    assert (np.diff(img[0, :, 0].astype(int)) >= 0).all()  # the ramp still rises left to right

    photo = np.random.default_rng(0).integers(0, 256, (40, 60, 3), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / "photo.png"), photo)
    before = cv2.cvtColor(cv2.imread(str(tmp_path / "photo.png"), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    assert np.array_equal(
        read(str(tmp_path / "photo.png"), 32), cv2.resize(before, (32, 32), interpolation=cv2.INTER_AREA)
    )
    cv2.imwrite(str(tmp_path / "black.png"), np.zeros((8, 8), np.uint16))
    assert not read(str(tmp_path / "black.png"), 8).any()


def test_a_qwk_submission_holds_whole_labels_in_the_training_range(project_modules):
    """submission.fill, for every task that scores QWK (tables, texts' essay scores): a regression's
    floats rounded and clipped into each target's training range (target_range); without a range
    (a checkpoint of an earlier kagtpl) rounded only; other metrics keep the floats."""
    fill = project_modules.submission.fill
    sample = pd.DataFrame({"essay_id": ["a", "b", "c", "d"], "score": [3, 3, 3, 3]})
    pred = np.array([[0.2], [2.5], [3.6], [9.7]])
    config = {"problem": "regression", "submission": "label", "metric": "qwk", "target_range": [[1.0], [6.0]]}
    sub, kind = fill(sample, pred, config, [])
    assert kind == "number" and sub["score"].tolist() == [1, 2, 4, 6] and sub["score"].dtype == np.int64
    assert fill(sample, pred, {**config, "target_range": []}, [])[0]["score"].tolist() == [0, 2, 4, 10]
    assert fill(sample, pred, {**config, "metric": "rmse"}, [])[0]["score"].tolist() == [0.2, 2.5, 3.6, 9.7]
    # the cuts chosen on the OOF rows (grades.with_cuts) instead of the halves: 2.5 reaches 1.5 and 2.2, grade 3
    cut = {**config, "cuts": [[1.5, 2.2, 3.0, 4.9, 5.5]]}
    assert fill(sample, pred, cut, [])[0]["score"].tolist() == [1, 3, 4, 6]


def test_qwk_cuts_chosen_on_oof_rows_beat_rounding_on_held_out_rows_and_the_kappa_is_sklearns(project_modules, capsys):
    """grades.py: a regression fitted for squared error pulls its predictions toward the mean (here
    0.6 of the way), and rounding at the halves hands in too few of the outer grades. The cuts
    chosen on 1,000 rows (the OOF rows) score better there and on 1,000 others; the kappa they are
    chosen by is scikit-learn's cohen_kappa_score(weights="quadratic")."""
    from sklearn.metrics import cohen_kappa_score

    grades = project_modules.grades
    rng = np.random.default_rng(0)
    y = rng.integers(0, 5, 2000)
    pred = 2 + 0.6 * (y - 2) + rng.normal(0, 0.45, 2000)
    rounded = np.clip(np.rint(pred), 0, 4).astype(int)
    for a, b in ((y, rounded), (y[:7], rounded[7:14]), (y + 3, y + 3), (np.zeros(5, int), np.ones(5, int))):
        sklearns = np.nan_to_num(cohen_kappa_score(a, b, weights="quadratic"))  # one label and one grade: nan, 0 here
        assert grades.quadratic_kappa(a, b) == pytest.approx(sklearns)
    cuts, best, at_halves = grades.qwk_cuts(y[:1000], pred[:1000], 0, 4)
    assert cuts == sorted(cuts) and len(cuts) == 4 and best > at_halves + 0.02, (cuts, best, at_halves)
    # the search counts its confusion matrices by binary search (CutConfusion): the kappa it reports is
    # the rows' own, cut by `cut`, and so is every matrix, values on a cut and NaN (graded lowest) too
    assert best == pytest.approx(grades.quadratic_kappa(y[:1000], grades.cut(pred[:1000], cuts, 0)), abs=1e-12)
    ties = np.concatenate([pred[:300], [0.5, 1.5, 2.5, 3.5, np.nan, np.nan]])
    labels = np.concatenate([y[:300], [0, 1, 2, 3, 4, 2]])
    for at in ([0.5, 1.5, 2.5, 3.5], [-9.0, 1.5, 1.5, 9.0], cuts):
        rows = np.bincount(labels * 5 + grades.cut(ties, at, 0), minlength=25).reshape(5, 5)
        assert (grades.CutConfusion(labels, ties, 5)(np.asarray(at)) == rows).all(), at
    held_out = grades.quadratic_kappa(y[1000:], grades.cut(pred[1000:], cuts, 0))
    assert held_out > grades.quadratic_kappa(y[1000:], rounded[1000:]) + 0.02, held_out
    config = {"metric": "qwk", "problem": "regression", "target": "grade", "target_range": [[0.0], [4.0]]}
    chosen = grades.with_cuts(config, y[:1000], pred[:1000])
    assert chosen["cuts"] == [cuts] and chosen["target_range"] == config["target_range"]
    line = f"CUTS: grade's grades 0-4 cut at [{', '.join(f'{c:.2f}' for c in cuts)}]: OOF QWK {best:.4f} over 1000 rows"
    assert capsys.readouterr().out.startswith(line + f", chosen on them (rounded at the halves: {at_halves:.4f})\n")
    assert (grades.whole(pred[1000:], chosen)[:, 0] == grades.cut(pred[1000:], cuts, 0)).all()
    # a checkpoint of an earlier kagtpl has no target_range: the cuts are chosen in the OOF rows' grades, 0-4,
    # and the submission is cut there (it was the smallest int64 in every row: a grade of -inf plus its cuts)
    earlier = grades.with_cuts({**config, "target_range": []}, y[:1000], pred[:1000])
    assert earlier["cuts"] == [cuts] and earlier["target_range"] == [[0.0], [4.0]], earlier
    assert (grades.whole(pred[1000:], earlier)[:, 0] == grades.cut(pred[1000:], cuts, 0)).all()
    assert grades.with_cuts({**config, "metric": "rmse"}, y, pred) == {**config, "metric": "rmse"}
    many = {**config, "target_range": [[0.0], [99.0]]}  # a score of 100 values, not grades: rounded, no cut
    assert grades.with_cuts(many, y, pred) == many and grades.with_cuts(config, None, None) == config
    # two targets, the second a score: no cut for either, and no CUTS line for the first's, which is not used
    two = {**config, "target": "grade,score", "target_range": [[0.0, 0.0], [4.0, 99.0]]}
    capsys.readouterr()
    assert grades.with_cuts(two, np.column_stack([y, y]), np.column_stack([pred, pred])) == two
    assert "CUTS" not in capsys.readouterr().out
