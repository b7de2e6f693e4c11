"""predict.py's seconds after run.py's `go`, with the model's library imported while train.py
trains (train.py's MODEL_LIBRARIES, prediction.start's `preload`) and without, side by side on
the same trained project, for each task.

On the sixth lent card (an H200) predict.py took 10.6-12.9 s after `go` in every task that built
its model with timm, smp, torchvision's detectors or transformers, and the table's took 1.5 s:
the scripts import those libraries where they build the model, after `go`, on the deadline's path.

    python benchmarks/predict_start.py [WORKDIR] [--tasks image,segmentation,detection,text,llm,audio,tabular]
                                       [--repeats 3] [--device cpu]

Each task's project is gpu_tasks.py's (kagtpl new on data kagtpl writes), trained for one epoch
of fold 0 (`train.py --epochs 1 --train-folds 1`). predict.py is then started as run.py starts it
(`--after-train`), `go` is sent once it waits on stdin, and the seconds from `go` to its exit are
timed: alternately as it is and with its preload turned off (submission.import_beside does
nothing), --repeats times each. The table gives the median of each and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "generator"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_tasks  # noqa: E402  (the tasks' data and projects)
from _project import work_dir  # noqa: E402

TASKS = ("image", "segmentation", "detection", "text", "llm", "audio", "tabular")
# predict.py as run.py starts it; WAITING when it reads stdin for `go`; PRELOAD=0 turns the preload off
WRAPPER = """
import os, runpy, sys
sys.path.insert(0, os.getcwd())
if os.environ["PRELOAD"] == "0":
    from machinery import submission
    submission.import_beside = lambda modules: None
class Stdin:
    def readline(self):
        print("WAITING", flush=True)
        sys.stdin = sys.__stdin__  # the real one again: loader workers close theirs
        return sys.stdin.readline()
sys.stdin = Stdin()
sys.argv = ["predict.py", "--after-train", *sys.argv[1:]]
runpy.run_path("predict.py", run_name="__main__")
"""


def after_go(project: Path, device: str, preload: bool, env: dict) -> float:
    """One predict.py: the seconds from `go` (sent once it waits) to its exit; an error names its output."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRAPPER, "--device", device],
        cwd=project,
        env={**env, "PRELOAD": "1" if preload else "0"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.strip() == "WAITING":
            break
    t0 = time.perf_counter()
    proc.stdin.write("go\n")
    proc.stdin.close()
    seen += proc.stdout.readlines()
    code, took = proc.wait(), time.perf_counter() - t0
    if code != 0 or not any(line.startswith("SUBMISSION: ") for line in seen):
        kind = "on" if preload else "off"
        sys.exit(f"ERROR: predict.py in {project} (preload {kind}) exited {code}:\n{''.join(seen)}")
    return took


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", type=Path, nargs="?", help="where the projects go (default: a temporary folder)")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--repeats", type=int, default=3, help="predict.py runs of each kind, alternating")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = p.parse_args()
    tasks = [t for t in args.tasks.split(",") if t]
    if sorted(set(tasks) - set(TASKS)):
        sys.exit(f"ERROR: --tasks: choose from {','.join(TASKS)}")
    work = args.work or work_dir("kagtpl-predict-start-")
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    gpu = "auto" if args.device == "cuda" else "cpu"
    print(f"predict.py after run.py's go, median of {args.repeats} ({args.device}, {os.cpu_count()} CPUs)")
    print(f"{'task':14}{'preload on':>12}{'preload off':>13}{'on / off':>10}")
    for task in tasks:
        project, flags = gpu_tasks.write_project(task, work / task, gpu)
        train = [sys.executable, "train.py", "--epochs", "1", "--train-folds", "1", "--no-grow"]
        train += ["--device", args.device, *flags]
        r = subprocess.run(train, cwd=project, env=env, capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"ERROR: train.py in {project} exited {r.returncode}:\n{(r.stdout + r.stderr)[-3000:]}")
        times = {True: [], False: []}
        for _ in range(args.repeats):
            for preload in (False, True):
                times[preload].append(after_go(project, args.device, preload, env))
        on, off = statistics.median(times[True]), statistics.median(times[False])
        print(f"{task:14}{on:>11.2f}s{off:>12.2f}s{on / off:>10.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
