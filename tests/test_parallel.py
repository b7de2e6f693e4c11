"""--parallel folds and --parallel ddp for real on CPU: fold workers as processes (--devices
cpu,cpu), and DDP through torchrun with the gloo backend. Plus the choice rules, fast."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
from test_growth import CUT_PLAN
from test_run import assert_valid_submission
from test_tabular import new_tabular

import conftest
from conftest import GROW_ENV, RUN_ENV, epoch_at_least, render, run_script, start_until

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
ONE_THREAD = {**RUN_ENV, "OMP_NUM_THREADS": "1"}  # 2 processes on 2 cores
# One process with batch 16 and two DDP ranks with batch 8 each see the same effective batch and
# the same initial weights, but not the same rows in the same groups (DistributedSampler deals a
# permutation round-robin), so the first epoch's mean loss differs by noise. Measured on the
# binary demo table (456 rows, 2 folds, seeds 1-3): 0.245 vs 0.319, 0.226 vs 0.271, 0.286 vs
# 0.251, i.e. within 30%. A DDP run that did not average gradients, or used another LR, is
# caught by check_in_sync (the ranks' weights must agree after each fold) and by this bound.
LOSS_TOLERANCE = 0.35


def torchrun(project, *args, timeout=300):
    """`torchrun --nproc-per-node=2 train.py --device cpu ARGS` in `project`, started as run_script
    starts a script: torchrun through the fork server and its two ranks its warm children (real
    processes, each without its 3-5 s of imports; tests/forkserver.py). agree.py's test below starts
    torchrun cold: it checks gloo's threads at a rank's exit with torch imported as a rank imports it."""
    return run_script(
        project, *TORCHRUN[1:], "train.py", "--device", "cpu", *args, timeout=timeout, check=False, env=ONE_THREAD
    )


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc: no pgrep needed)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return sorted(found)


def first_epoch_loss(log: str) -> float:
    return float(re.search(r"^Epoch 1: Loss=([\d.]+)", log, re.M).group(1))


# ----------------------------------------------------------------------------- the choice (fast)


@pytest.mark.parametrize(
    "mode,devices,folds,world,chosen",
    [
        ("auto", ["cuda:0", "cuda:1"], 5, 1, "folds"),  # Kaggle T4x2: both GPUs, no flag
        ("auto", ["cuda:0", "cuda:1"], 1, 1, "none"),  # fewer folds than GPUs
        ("auto", ["cuda:0"], 5, 1, "none"),
        ("auto", ["cpu"], 5, 1, "none"),
        ("auto", ["cuda:0"], 5, 2, "ddp"),  # under torchrun
        ("folds", ["cpu", "cpu"], 4, 1, "folds"),
        ("none", ["cuda:0", "cuda:1"], 5, 1, "none"),
    ],
)
def test_parallel_choice(project_modules, monkeypatch, mode, devices, folds, world, chosen):
    monkeypatch.setenv("WORLD_SIZE", str(world))
    got, why = project_modules.parallel.choose(mode, devices, folds)
    assert got == chosen and why


@pytest.mark.parametrize(
    "mode,devices,world,message",
    [
        ("ddp", ["cuda:0", "cuda:1"], 1, "--parallel ddp needs torchrun"),
        ("folds", ["cuda:0"], 1, "--parallel folds needs 2 or more devices"),
        ("folds", ["cpu", "cpu"], 2, "use --parallel ddp"),
    ],
)
def test_parallel_choice_errors(project_modules, monkeypatch, mode, devices, world, message):
    monkeypatch.setenv("WORLD_SIZE", str(world))
    with pytest.raises(project_modules.errors.RunError, match=re.escape(message)):
        project_modules.parallel.choose(mode, devices, 5)


def test_fold_queue_gives_each_fold_once_and_keeps_the_smallest_cap(project_modules, tmp_path):
    queue = project_modules.workers.FoldQueue(tmp_path / ".folds")
    queue.reset(5)
    other = project_modules.workers.FoldQueue(tmp_path / ".folds")  # a second worker's view
    assert queue.take(0) and not other.take(0) and other.take(1)
    assert set(queue.claims()) == {0, 1}
    assert queue.cap(5) == 5 and other.cap(3) == 3 and queue.cap(4) == 3  # cut by one, kept by all
    queue.reset(5)
    assert queue.claims() == {} and queue.cap(5) == 5


def test_one_fold_worker_chooses_the_tta_views_and_every_workers_reserve_prices_them(project_modules, tmp_path):
    """The first worker past the split claims the views' choice (growing.views_on_workers); the factor
    it leaves is what every worker's reserve prices a checkpoint's prediction at, set again before each
    grown unit without compounding. A new run forgets both."""
    queue, other = (project_modules.workers.FoldQueue(tmp_path / ".folds") for _ in range(2))
    queue.reset(5)
    assert other.view_factor() == 1.0  # nothing chosen yet: the plan's views
    assert queue.take_views() and not other.take_views()
    queue.set_view_factor(2.0)
    reserve = project_modules.planner.PredictionReserve(600, 10.0)
    reserve.note_inference(2.0, 100, 1000, 2, 0.001)
    plan_s = reserve.fold_s
    for _ in range(3):  # before each grown unit
        reserve.set_view_factor(other.view_factor())
    assert reserve.fold_s == pytest.approx(2 * plan_s) and reserve.view_factor == 2.0
    (tmp_path / ".folds" / "views.json").write_text("")  # cut short (a full disk): the plan's views' price
    assert other.view_factor() == 1.0
    queue.reset(5)
    assert not (tmp_path / ".folds" / "views.json").exists() and queue.take_views()


def test_a_fold_worker_sees_the_card_its_parent_calls_cuda_n(project_modules, monkeypatch):
    workers = project_modules.workers
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [workers.visible_gpu(i) for i in (0, 1)] == ["0", "1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")  # a shared server gave this run cards 2 and 3
    assert [workers.visible_gpu(i) for i in (0, 1)] == ["2", "3"]  # not "0", "1": somebody else's
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5b3e, GPU-77aa")  # UUIDs work the same way
    assert workers.visible_gpu(1) == "GPU-77aa"


def test_cpu_share_splits_the_loader_workers(project_modules, monkeypatch):
    hardware = project_modules.hardware
    monkeypatch.setattr(hardware, "machine_cpus", lambda: 4)  # Kaggle's 4 vCPUs
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv(hardware.CPU_SHARE_ENV, raising=False)
    assert hardware.loader_settings(hardware.usable_cpus(), True)["num_workers"] == 3
    monkeypatch.setenv(hardware.CPU_SHARE_ENV, "2")  # two fold workers: 1 loader worker each, not 3
    assert hardware.loader_settings(hardware.usable_cpus(), True)["num_workers"] == 1
    monkeypatch.delenv(hardware.CPU_SHARE_ENV)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun's two ranks on this node
    assert hardware.usable_cpus() == 2


def test_planner_shares_the_later_folds_between_workers(project_modules):
    rules = project_modules.planner.TimePlanner
    one, two = rules(3600, 4, 10), rules(3600, 4, 10)
    two.parallel = 2
    # fold 0 just started: 10 epochs of it, then 3 folds alone, or ceil(3 / 2) = 2 each side by side
    assert one.times.progress(1).need(1.0, 4, 10) == 40 and two.times.progress(two.parallel).need(1.0, 4, 10) == 30


# ----------------------------------------------------------------------------- ddp (torchrun)


# The longest of these tests (a 40 s budget, 60 s until 2026-12-06: the run ended at 46 s of it, 0.77; 37-50 s
# of the suite) first: the last one in the file ran last in the suite, 50 s while the other worker had nothing
# left (xdist cannot steal a running test's next)
@pytest.mark.slow
def test_a_budget_stop_ends_both_fold_workers_in_time(tmp_path):
    project, _ = new_tabular(tmp_path, "binary")
    t0 = time.time()
    r = run_script(
        project,
        "run.py",
        "--budget",
        "40s",
        "--device",
        "cpu",
        "--parallel",
        "folds",
        "--devices",
        "cpu,cpu",
        "--epochs",
        "100000",
        "--patience",
        "100000",
    )
    log = r.stdout
    total = float(re.search(r"^RUN: train .*, total ([\d.]+)s", log, re.M).group(1))
    assert total <= 40, log[-3000:]  # run.py's own clock, from its process start
    handed_in = (project / "output" / "submission.csv").stat().st_mtime - t0  # from outside, as above
    assert handed_in <= 42, (handed_in, log[-3000:])
    assert re.search(r"^\[cpu0\] TIME PLAN: ", log, re.M) and re.search(r"^\[cpu1\] TIME PLAN: ", log, re.M)
    assert "RUN: train.py still running" not in log  # the workers' own planners ended training
    assert "SUBMISSION: " in log


@pytest.fixture(scope="module")
def table_project(tmp_path_factory):
    project, data = new_tabular(tmp_path_factory.mktemp("ddp"), "binary")
    return project, data


@pytest.mark.slow
def test_ddp_dry_run_and_a_short_run_where_rank_0_alone_writes(table_project):
    project, data = table_project
    dry = torchrun(project, "--dry-run", "--out-dir", "dry")
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    r = torchrun(project, "--folds", "2", "--epochs", "3", "--batch-size", "8", "--out-dir", "ddp")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    log = r.stdout
    # one log: rank 1's stdout is silenced, so every line appears once
    assert log.count("PARALLEL: ddp (torchrun started 2 processes") == 1 and "rank 0 of 2" in log
    assert re.search(r"^BATCH: 8 per GPU x 2 GPUs x 1 accumulation = effective batch 16 \(set by you\)$", log, re.M)
    out = project / "ddp"
    records = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    epochs_logged = re.findall(r"^Epoch (\d+): ", log, re.M)
    # one record per epoch (rank 1 wrote none); the log's Epoch lines at most one a second, and each
    # fold's first and last
    assert sorted((r["fold"], r["epoch"]) for r in records) == [(k, e) for k in (0, 1) for e in (1, 2, 3)]
    assert 4 <= len(epochs_logged) <= 6 and epochs_logged.count("3") == 2
    assert len({r["run"] for r in records}) == 1
    # every rank trains the MLP first, then rank 0 alone the boosters (their process group is gone by
    # then): before, no rank trained them, while the MODELS line named them all the same
    models = re.search(r"^MODELS: (.+) \(", log, re.M).group(1).split(", ")
    assert len(pd.read_csv(out / "experiments.csv")) == len(models)  # one row a model, rank 0's
    mlp_done = log.index("OOF: ") if "mlp" in models else 0
    for name in (m for m in models if m != "mlp"):
        assert log.index(f"BOOSTER: {name} ") > mlp_done and re.search(rf"^OOF: .* \({name}\)$", log, re.M), log
        assert len(list(out.glob(f"test_{name}_fold[01].csv"))) == 2
    oof = pd.read_csv(out / "oof.csv")
    train = pd.read_csv(data / "train.csv")
    assert sorted(oof["row_id"]) == sorted(train["row_id"])  # every rank's share gathered, padding dropped
    assert sorted(p.name for p in out.glob("model_fold*.pth")) == ["model_fold0.pth", "model_fold1.pth"]
    ckpt = torch.load(out / "model_fold0.pth", map_location="cpu", weights_only=True)
    assert ckpt["complete"] and not any(k.startswith("module.") for k in ckpt["model"])  # the bare model's keys
    assert not list(out.glob("*.tmp*"))
    pred = run_script(project, "predict.py", "--device", "cpu", "--out-dir", "ddp")
    assert "ENSEMBLE: 2 checkpoint(s)" in pred.stdout


@pytest.mark.slow
def test_ddp_first_epoch_loss_matches_one_process_with_the_same_effective_batch(table_project):
    project, _ = table_project
    common = ("--folds", "2", "--epochs", "1", "--seed", "1")
    one = run_script(project, "train.py", "--device", "cpu", "--batch-size", "16", "--out-dir", "one", *common)
    two = torchrun(project, "--batch-size", "8", "--out-dir", "two", *common)
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    a, b = first_epoch_loss(one.stdout), first_epoch_loss(two.stdout)
    assert abs(a - b) <= LOSS_TOLERANCE * a, (a, b)
    lr = re.compile(r"^Epoch 1: .*LR=(\S+),", re.M)
    assert lr.search(one.stdout).group(1) == lr.search(two.stdout).group(1)  # one LR rule for one effective batch


AGREE_BATCHING = """
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, sys.argv[1])
from machinery import engine, parallel, probe

device = parallel.start_ddp("cpu")
rank = dist.get_rank()
# what each rank's batch probe found on its own GPU: rank 1's card is the fuller one
found = {0: (64, 1), 1: (48, 2)}[rank]
batching = engine.Batching(found[0], found[1], 1e-3)
optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
probe.agree_batching(batching, 1e-3, device, optimizer)
lr = optimizer.param_groups[0]["lr"]
parallel.finish_ddp()  # a barrier, then leave: as train.py does
# gloo's threads must be gone now: one left alive dies in the interpreter's exit (SIGABRT)
threads = sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
# one file per rank: two ranks printing to one shared stdout can interleave within a line
with open(f"{sys.argv[2]}/rank{rank}.txt", "w") as f:
    f.write(f"rank {rank}: {batching.size} x {batching.accum_steps} x {batching.world} lr {lr:.3e}")
    f.write(f" threads {[t for t in threads if 'gloo' in t]}")
"""


@pytest.mark.slow
def test_ddp_ranks_take_the_smallest_probed_batch(table_project, tmp_path):
    """The batch probe runs per GPU; all ranks then train with the smallest batch (the fullest
    card decides) and the most accumulation, through real gloo collectives."""
    project, _ = table_project
    script = tmp_path / "agree.py"
    script.write_text(AGREE_BATCHING)
    r = subprocess.run(
        [*TORCHRUN, str(script), str(project), str(tmp_path)],
        env=ONE_THREAD,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[:4000]  # a rank's own error comes before torchrun's
    lr = 1e-3 * (48 * 2 * 2 / 128) ** 0.5  # hardware.scaled_lr on the effective batch, both ranks' rows
    lines = [(tmp_path / f"rank{k}.txt").read_text() for k in (0, 1)]
    # no gloo thread outlives finish_ddp: the optimizer's import of torch._dynamo once kept the
    # group alive, and its threads aborted the exit of 2 runs in 60 on 2 busy cores
    assert lines == [f"rank {k}: 48 x 2 x 2 lr {lr:.3e} threads []" for k in (0, 1)], r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_ddp_sigterm_to_one_rank_stops_both_at_the_same_step(table_project, sig):
    """The signal reaches one rank only; the other learns it from the next all-reduce, both save and
    exit 0 (a rank that left while the other waited in a collective would hang the run). SIGHUP (the
    terminal closed) votes as SIGTERM: its reason, no stop of the vote's, raised in the collective."""
    project, _ = table_project
    args = [*TORCHRUN[1:], "train.py", "--device", "cpu", "--folds", "2", "--epochs", "5000", "--patience", "5000"]
    proc, seen = start_until(project, args, epoch_at_least(20), env=ONE_THREAD)
    ranks = children(proc.pid)  # torchrun's two worker processes
    assert len(ranks) == 2, ranks
    os.kill(ranks[-1], sig)
    seen += proc.stdout.readlines()
    assert proc.wait(timeout=60) == 0, "".join(seen[-40:])
    log = "".join(seen)
    assert "STOPPED: SIGTERM; exiting 0 so predict.py runs" in log
    assert (project / "output" / "model_fold0.pth").exists() and "FOLD 1 (" not in log


@pytest.mark.slow
def test_run_py_ddp_budget_stop_ends_both_ranks_in_time(table_project):
    """run.py --parallel ddp starts torchrun; the ranks' agreed plan ends training in time, and
    the run hands in a submission inside the budget."""
    project, data = table_project
    t0 = time.time()
    flags = ["--budget", "40s", "--device", "cpu", "--parallel", "ddp", "--nproc-per-node", "2", "--out-dir", "b"]
    r = run_script(project, "run.py", *flags, "--epochs", "100000", "--patience", "100000", env=ONE_THREAD)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    log = r.stdout
    assert "PARALLEL: ddp (torchrun started 2 processes" in log
    assert re.search(r"^TIME PLAN: .*-> .*epochs 100000->\d+", log, re.M), log[-2000:]
    assert "RUN: train.py still running" not in log  # the ranks' own plan ended training
    total = float(re.search(r"^RUN: train .*, total ([\d.]+)s", log, re.M).group(1))
    assert total <= 40, log[-3000:]  # run.py's own clock, from its process start
    # and from outside: the submission's file was in place 40 s (+2 s to start a process under a
    # loaded CI) after the test started run.py; the interpreters' exits after it do not count
    handed_in = (project / "b" / "submission.csv").stat().st_mtime - t0
    assert handed_in <= 42, (handed_in, log[-3000:])
    sub = pd.read_csv(project / "b" / "submission.csv")
    assert len(sub) == len(pd.read_csv(data / "sample_submission.csv"))


# ----------------------------------------------------------------------------- fold workers


@pytest.mark.slow
def test_fold_workers_train_4_folds_that_predict_ensembles(tmp_path, digits_dir):
    project = render(tmp_path / "proj", data_dir=str(digits_dir), folds=4, epochs=1)
    r = run_script(project, "train.py", "--device", "cpu", "--parallel", "folds", "--devices", "cpu,cpu")
    log = r.stdout
    assert "PARALLEL: folds (2 devices (cpu,cpu): fold k on the next free one, 4 folds)" in log
    assert re.search(r"^PARALLEL: cpu0 started, pid \d+$", log, re.M) and "[cpu1] PARALLEL: folds (worker 2 of 2" in log
    trained = {tag: re.findall(rf"^\[{tag}\] FOLD (\d) DONE", log, re.M) for tag in ("cpu0", "cpu1")}
    assert sorted(trained["cpu0"] + trained["cpu1"]) == ["0", "1", "2", "3"], trained  # each fold once
    assert trained["cpu0"] and trained["cpu1"]  # both workers trained
    assert "CACHE: decoded" not in "".join(line for line in log.splitlines() if line.startswith("["))  # built once
    out = project / "output"
    for k in range(4):
        assert torch.load(out / f"model_fold{k}.pth", map_location="cpu", weights_only=True)["complete"]
    assert re.search(r"^OOF: Acc=[\d.]+, logloss=[\d.]+ over 240 rows from folds \[0, 1, 2, 3\]$", log, re.M)
    records = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert sorted(r["fold"] for r in records) == [0, 1, 2, 3] and len({r["run"] for r in records}) == 1
    pred = run_script(project, "predict.py", "--device", "cpu").stdout
    assert "ENSEMBLE: 4 checkpoint(s), folds [0, 1, 2, 3]" in pred
    assert_valid_submission(project, digits_dir)


@pytest.mark.slow
@pytest.mark.alone  # two fold workers on 2 cores under a budget: beside another test, no seed fits
def test_fold_workers_grow_the_seed_units_they_claim_once_each(tmp_path, digits_dir):
    """Issue 57, item 8: with fold workers (Kaggle's T4x2) a plan that fits grows too. Each worker,
    its planned folds done, claims (seed, fold) units from the shared queue as it claimed folds,
    each while it fits: no unit is trained twice, and predict.py ensembles what they grew. Before,
    growth was off under --parallel folds and the budget's rest went unused. The TTA views are chosen
    once, by the first worker past the split, before its seeds (they were never grown on workers)."""
    project = render(tmp_path / "proj", data_dir=str(digits_dir), folds=2, epochs=2)
    flags = ["--device", "cpu", "--parallel", "folds", "--devices", "cpu,cpu", "--no-pretrained"]
    log = run_script(project, "run.py", "--budget", "75s", *flags, env=GROW_ENV).stdout
    assert re.search(r"^\[cpu\d\] GROW: more seeds: ", log, re.M), log[-3000:]
    grown = re.findall(r"^\[cpu\d\] GROW: seed (\d) fold (\d) DONE: ", log, re.M)
    assert grown and len(grown) == len(set(grown)), log[-3000:]  # each unit once
    out = project / "output"
    # each worker's folds' val losses, for every worker's choice of the seeds' epochs
    curves = {f.name: json.loads(f.read_text()) for f in (out / ".folds").glob("curve*.json")}
    assert sorted(curves) == ["curve0.json", "curve1.json"] and all(c["planned"] == 2 for c in curves.values())
    for seed_no, k in grown:
        assert torch.load(out / f"model_fold{k}_seed{seed_no}.pth", weights_only=True)["complete"]
    verdict = re.search(r"^GROW: OOF logloss .*: (kept|left out)", log, re.M)
    n = 2 + len(grown) if verdict and verdict[1] == "kept" else 2
    assert re.search(rf"^ENSEMBLE: {n} checkpoint\(s\)", log, re.M), log[-3000:]
    made = re.search(r"^SUBMISSION: output/submission.csv \(40 rows, (\d+) fold\(s\) ensembled\)$", log, re.M)
    assert made, log[-3000:]  # every checkpoint, or those predict.py's deadline left time for (best first)
    assert int(made[1]) == n or f"PREDICT: deadline: {made[1]} of {n} fold(s) used" in log, log[-3000:]
    share = float(re.search(r"^RUN: .* = ([\d.]+) of the 75s budget$", log, re.M).group(1))
    assert share <= 1.0, log[-3000:]
    # the TTA views: one worker chooses (the plan's image and mirror, up to 4), before its seeds
    stayed = r" \((?:no fold's evidence fits|deadline|SIGTERM)\)"  # no evidence: none fitted, or a stop came
    views = re.findall(rf"^\[(cpu\d)\] GROW: TTA views (stay )?([\w+, ]+)(:|{stayed})", log, re.M)
    assert len(views) == 1, log[-3000:]
    tag, stays, names, how = views[0]
    lines = log.splitlines()
    chose = next(i for i, line in enumerate(lines) if line.startswith(f"[{tag}] GROW: TTA views"))
    seeds = next(i for i, line in enumerate(lines) if re.match(rf"\[{tag}\] GROW: (more seeds|none)", line))
    assert chose < seeds, log[-3000:]
    if how == ":":  # chosen on the folds complete then (its own, at least), and written for predict.py
        chosen = json.loads((out / "tta_views.json").read_text())["views"]
        assert names == ", ".join(chosen) and bool(stays) == (len(chosen) == 2), log[-3000:]
        factor = json.loads((out / ".folds" / "views.json").read_text())
        assert factor == pytest.approx(len(chosen) / 2), factor  # every worker's reserve prices them
        assert (f"PREDICT: TTA views {', '.join(chosen)} (grown" in log) == (len(chosen) > 2), log[-3000:]
    else:
        assert not (out / "tta_views.json").exists()


@pytest.mark.slow
@pytest.mark.alone  # two fold workers on 2 cores under a budget
def test_fold_workers_give_a_cut_plans_folds_back_before_any_seed(tmp_path, digits_dir):
    """With fold workers (Kaggle's T4x2) a plan the planner cut (4 -> 2 folds) with time left
    gets folds 2 and 3 of the split back, each claimed by one worker, before that worker grows a
    seed; the OOF then holds every row. Before, the workers grew seeds of folds 0 and 1, and folds
    2 and 3 were never trained (a sequential run had given them back since 2026-12-04)."""
    project = render(tmp_path / "proj", data_dir=str(digits_dir), folds=4, epochs=2)
    (project / "cut_plan.py").write_text(CUT_PLAN)  # its workers run it too: each one's plan is cut
    flags = ["--device", "cpu", "--no-pretrained", "--parallel", "folds", "--devices", "cpu,cpu", "--budget", "5m"]
    ended = set()

    def both_past_the_split(line: str) -> bool:  # each worker's first growth line after the split's folds
        found = re.match(r"\[(cpu\d)\] GROW: (more seeds|none|stop)", line)
        ended.update([found[1]] if found else [])
        return len(ended) == 2

    proc, seen = start_until(project, ["cut_plan.py", *flags], both_past_the_split, env=GROW_ENV)
    log = conftest.stop_group(proc, seen)  # the order is the subject, not the seeds: save and end
    assert proc.returncode == 0, log[-3000:]
    backs = re.findall(r"^\[(cpu\d)\] GROW: fold (\d) back \(the plan had cut it to \d folds\)", log, re.M)
    assert sorted(k for _, k in backs) == ["2", "3"], log[-3000:]  # each once, by one worker
    lines = log.splitlines()
    for tag, k in backs:  # the worker's fold of the split is done before it grows a seed
        done = next(i for i, line in enumerate(lines) if line.startswith(f"[{tag}] FOLD {k} DONE: "))
        seeds = (f"[{tag}] GROW: more seeds", f"[{tag}] GROW: seed")
        grew = [i for i, line in enumerate(lines) if line.startswith(seeds)]
        assert all(done < i for i in grew), log[-3000:]
    assert re.search(r"^OOF: .* over 240 rows from folds \[0, 1, 2, 3\]$", log, re.M), log[-3000:]
    folds = {p.name for p in (project / "output").glob("model_fold[0-9].pth")}
    assert folds == {f"model_fold{k}.pth" for k in range(4)}, log[-3000:]


@pytest.mark.slow
@pytest.mark.alone  # two fold workers on 2 cores under a budget
def test_a_fold_whose_worker_died_is_taken_again_before_a_seed_grows(tmp_path, digits_dir):
    """The OOM killer takes one fold worker mid-fold under a --budget (Kaggle's T4x2): the living
    worker, its own folds done, takes the dead worker's fold again before it grows a seed, and the
    run ends 0 with every fold (a WARNING names the dead worker). Before, the living worker grew
    seeds to the budget's end, the workers' second round found no time left, and the run ended 1
    with the fold lost (`fold worker cpu1 exited -9, fold(s) [1] lost`)."""
    project = render(tmp_path / "proj", data_dir=str(digits_dir), folds=2, epochs=30)
    flags = ["--device", "cpu", "--no-pretrained", "--parallel", "folds", "--devices", "cpu,cpu", "--budget", "5m"]
    proc, seen = start_until(project, ["train.py", *flags, "--patience", "30"], epoch_at_least(3, "[cpu1] "), GROW_ENV)
    pid = int(re.search(r"^PARALLEL: cpu1 started, pid (\d+)$", "".join(seen), re.M).group(1))
    k = int(re.search(r"^\[cpu1\] FOLD (\d) \(", "".join(seen), re.M).group(1))  # the fold cpu1 is on
    os.kill(pid, signal.SIGKILL)
    for line in proc.stdout:  # until the living worker has trained it
        seen.append(line)
        if line.startswith(f"[cpu0] FOLD {k} DONE: "):
            break
    log = conftest.stop_group(proc, seen)  # the seeds are not the subject: save and end
    assert proc.returncode == 0, log[-3000:]
    assert re.search(rf"^\[cpu0\] GROW: fold {k} back \(its worker, pid {pid}, died in it\): ", log, re.M), log[-3000:]
    assert "WARNING: fold worker cpu1 exited -9: no fold lost" in log and " lost:" not in log, log[-3000:]
    assert torch.load(project / "output" / f"model_fold{k}.pth", weights_only=True)["complete"], log[-3000:]
    assert re.search(r"^OOF: .* over 240 rows from folds \[0, 1\]$", log, re.M), log[-3000:]


@pytest.mark.slow
@pytest.mark.alone  # two fold workers on 2 cores under a budget
def test_a_tables_boosters_grow_seeds_beside_mlp_fold_workers(tmp_path):
    """A table under --parallel folds (Kaggle's T4x2 default): the workers train and grow the MLP's
    folds, and train.py's own process, which trained the boosters, grows their seeds with the time
    left, as a run on one device does. Before, `GROW: trees none (--parallel folds)`: 73% of a 90 s
    budget went unused."""
    project, _ = new_tabular(tmp_path, "binary")
    flags = ["--device", "cpu", "--parallel", "folds", "--devices", "cpu,cpu", "--models", "lgbm,mlp"]
    # 3m: both models reach their 5-seed cap long before it (~20 s here), with room for a machine 3x slower
    log = run_script(project, "run.py", "--budget", "3m", *flags, env=GROW_ENV).stdout
    assert re.search(r"^\[cpu\d\] GROW: more seeds: ", log, re.M), log[-3000:]  # the MLP's, in the workers
    assert re.search(r"^GROW: more tree seeds: ", log, re.M) and "trees none" not in log, log[-3000:]
    grown = re.findall(r"^FOLD (\d) lgbm \(seed (\d)\): \d+ trees", log, re.M)
    assert ("0", "2") in grown, log[-3000:]
    made = re.search(r"^PREDICT: lgbm: (\d+) fold\(s\) from test_lgbm_fold", log, re.M)
    assert made and int(made[1]) == 3 + len(grown), log[-3000:]  # the grown seeds' test files blended in
    assert re.search(r"^RUN: handed in output/submission.csv, predict.py's ensemble", log, re.M), log[-3000:]


@pytest.mark.slow
def test_sigterm_to_train_py_reaches_every_fold_worker(tmp_path):
    """A container stop signals train.py; it forwards SIGTERM to its workers, each saves the fold
    it is on and exits 0, and train.py scores what there is and exits 0 so predict.py runs."""
    project, _ = new_tabular(tmp_path, "binary")
    flags = ["--parallel", "folds", "--devices", "cpu,cpu", "--folds", "4", "--epochs", "5000", "--patience", "5000"]
    proc, seen = start_until(project, ["train.py", "--device", "cpu", *flags], epoch_at_least(5, "[cpu1] "))
    proc.send_signal(signal.SIGTERM)  # to train.py alone, not its group: the forwarding is under test
    seen += proc.stdout.readlines()
    log = "".join(seen)
    assert proc.wait(timeout=120) == 0, log[-3000:]
    for tag in ("cpu0", "cpu1"):
        assert re.search(rf"^\[{tag}\] STOPPED: SIGTERM; exiting 0", log, re.M), log[-3000:]
    assert "lost" not in log and "STOPPED: SIGTERM" in log
    assert len(list((project / "output").glob("model_fold*.pth"))) == 2  # the two folds in training, saved


@pytest.mark.slow
@pytest.mark.alone  # two fold workers on 2 cores, 30 s: beside another test, no epoch past the first (twice)
def test_fold_workers_reach_their_deadline_after_the_log_reader_goes_away(tmp_path):
    """`python train.py ... | head`: the reader closes the pipe mid-run. train.py goes on draining
    its workers' lines (into /dev/null), so they still stop at the deadline and save their folds,
    and it scores them and exits 0. Were its relay to stop, each worker would fill its pipe in
    seconds and block in its next print, past any deadline (what this test saw before the fix)."""
    project, _ = new_tabular(tmp_path, "binary")
    flags = ["--parallel", "folds", "--devices", "cpu,cpu", "--folds", "4", "--models", "mlp"]
    args = ["train.py", "--device", "cpu", *flags, "--budget", "30s", "--epochs", "5000", "--patience", "5000"]
    proc, seen = start_until(project, args, epoch_at_least(3, "[cpu1] "))
    proc.stdout.close()  # the reader is gone: train.py's next write to stdout fails with EPIPE
    try:
        assert proc.wait(timeout=120) == 0  # no hang: at the deadline, the workers stop and train.py scores
    finally:
        if proc.poll() is None:  # the hang this test is for: leave no process behind
            os.killpg(proc.pid, signal.SIGKILL)
    out = project / "output"
    assert len(list(out.glob("model_fold*.pth"))) == 2  # each worker saved the fold it was on
    records = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
    assert {r["fold"] for r in records} == {0, 1} and max(r["epoch"] for r in records) > 3


@pytest.mark.slow
def test_a_killed_fold_worker_s_fold_is_trained_again_and_a_rerun_resumes(tmp_path):
    """A fold worker killed by another (the OOM killer, a GPU fault) mid-fold: the other worker goes
    on, then the workers start again once for the lost fold (complete folds skipped), and the run
    ends 0 with every fold. Before, the fold was lost and train.py ended 1 asking for a rerun, the
    rest of the budget unused. A rerun then trains nothing."""
    project, _ = new_tabular(tmp_path, "binary")
    flags = ["train.py", "--device", "cpu", "--parallel", "folds", "--devices", "cpu,cpu", "--folds", "4"]
    slow = ["--epochs", "60", "--patience", "60"]  # a fold takes a few seconds on 2 cores
    proc, seen = start_until(project, [*flags, *slow], epoch_at_least(3, "[cpu1] "))
    pid = int(re.search(r"^PARALLEL: cpu1 started, pid (\d+)$", "".join(seen), re.M).group(1))
    os.kill(pid, signal.SIGKILL)
    seen += proc.stdout.readlines()
    log = "".join(seen)
    assert proc.wait(timeout=300) == 0, log[-3000:]
    lost = re.search(
        r"^PARALLEL: fold worker cpu1 exited -9, fold\(s\) \[(\d)\] lost: the workers start again once", log, re.M
    )
    assert lost, log[-3000:]
    k = int(lost.group(1))
    first, again = log[: lost.start()], log[lost.start() :]
    done = sorted(int(x) for x in re.findall(r"^\[cpu0\] FOLD (\d) DONE", first, re.M))
    assert done == sorted(set(range(4)) - {k}), (done, k)  # the other worker took every other fold
    assert re.search(rf"^\[cpu\d\] FOLD {k} DONE", again, re.M), log[-3000:]  # the lost fold, trained again
    skipped = {int(f) for f in re.findall(r"model_fold(\d)\.pth is complete, skipping \(resume\)", again)}
    assert skipped == set(done), log[-3000:]  # the complete folds are not trained again
    assert "ERROR" not in log and len(list((project / "output").glob("model_fold*.pth"))) == 4
    rerun = run_script(project, *flags, *slow).stdout
    resumed = {int(f) for f in re.findall(r"model_fold(\d)\.pth is complete, skipping \(resume\)", rerun)}
    assert resumed == set(range(4)), rerun[-3000:]
