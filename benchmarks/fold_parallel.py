"""Fold-parallel vs sequential: the same generated project trains the same folds and epochs
twice, side by side in one run: once in one process (--parallel none), once as 2 fold workers
(--parallel folds --devices cpu,cpu). One torch thread per process and no loader workers, so
each process uses one core, as each worker uses one GPU on T4x2. Reports both wall times and
their ratio (goal: about 0.55; 0.5 is perfect scaling, the rest is the workers' start-up).

    python benchmarks/fold_parallel.py [--folds 4] [--epochs 6] [--images 400] [--model resnet18]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from _project import ROOT, work_dir

sys.path.insert(0, str(ROOT / "generator"))
from kagtpl import demo  # noqa: E402


def train(project: Path, out: str, *flags: str) -> tuple[float, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    t0 = time.time()
    r = subprocess.run(
        [sys.executable, "train.py", "--device", "cpu", "--workers", "0", "--out-dir", out, *flags],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.time() - t0
    if r.returncode != 0:
        sys.exit(f"train.py {' '.join(flags)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return wall, r.stdout


def epoch_seconds(log: str) -> float:
    """Mean of the Epoch lines' Time= (training and validation of one epoch)."""
    times = [float(t) for t in re.findall(r"Epoch \d+: .*Time=([\d.]+)s", log)]
    return sum(times) / len(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--folds", type=int, default=4)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--images", type=int, default=400, help="digit images to train on")
    p.add_argument("--model", default="resnet18", help="timm model (tests/test_benchmarks.py: resnet10t)")
    args = p.parse_args()
    import copier

    work = work_dir("kagtpl-bench-folds-")
    data = demo.write_digits(work / "data", n_train=args.images, n_test=40)
    project = work / "proj"
    answers = {"project_name": "proj", "task": "image", "gpu": "cpu", "model": args.model, "image_size": 32}
    copier.run_copy(
        str(ROOT), project, data={**answers, "data_dir": str(data)}, defaults=True, vcs_ref="HEAD", quiet=True
    )
    # every fold runs every epoch (no early stop): the same work both ways
    work_flags = ["--folds", str(args.folds), "--epochs", str(args.epochs), "--patience", str(args.epochs + 1)]
    train(project, "warm", "--dry-run")  # the decode cache and the page cache, for both runs alike
    seq, seq_log = train(project, "seq", *work_flags, "--parallel", "none")
    par, log = train(project, "par", *work_flags, "--parallel", "folds", "--devices", "cpu,cpu")
    trained = {tag: len(re.findall(rf"^\[{tag}\] FOLD \d+ DONE", log, re.M)) for tag in ("cpu0", "cpu1")}
    seq_epoch, par_epoch = epoch_seconds(seq_log), epoch_seconds(log)
    seq_train, par_train = seq_epoch * args.folds * args.epochs, par_epoch * args.folds * args.epochs / 2
    plan = f"{args.folds} folds x {args.epochs} epochs, {args.images} digit images"
    print(f"fold-parallel: {args.model} at 32 px, {plan}, CPU")
    print(f"machine: {os.cpu_count()} CPUs; one torch thread per process, no loader workers")
    print(f"sequential (1 process):      {seq:.1f}s")
    print(f"fold-parallel (2 workers):   {par:.1f}s   folds per worker: {trained}")
    print(f"wall-time ratio parallel/sequential: {par / seq:.2f}   (goal ~0.55)")
    print(f"mean epoch: {seq_epoch:.2f}s alone, {par_epoch:.2f}s with the other worker beside it")
    print(f"  epochs alone: {seq_train:.0f}s vs {par_train:.0f}s side by side = {par_train / seq_train:.2f};")
    print(f"  the rest is start-up and finish: {seq - seq_train:.0f}s sequential, {par - par_train:.0f}s parallel")


if __name__ == "__main__":
    main()
