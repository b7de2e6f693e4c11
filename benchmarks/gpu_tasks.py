"""Every task under run.py --budget on one device: gpu_smoke.sh's task step (issue 46).

For each task it writes data with kagtpl's own generators (digits, a table, texts, shapes, boxes,
spoken words), renders a project with --gpu auto, runs `run.py --budget B --no-pretrained` (text:
a tiny BERT-shaped encoder and a tiny Qwen2 decoder with LoRA, made here offline as
tests/llmdata.py makes them), and checks its log:
- the submission came from trained folds (`SUBMISSION: ... (N rows, K fold(s) ensembled)`), not
  the fallback;
- predict.py said its PRECISION line;
- no traceback;
- the first epoch against a steady one (fold 0's Epoch lines: the first's Time over the median of
  the rest), reported;
- the share of the budget used (run.py's RUN line) and the folds grown (issue 48's GROW lines, and
  the boosters' seeds), reported;
- predict.py's seconds after run.py's `go` against the reserve train.py kept for it, reported.

    python benchmarks/gpu_tasks.py WORKDIR [--device cuda] [--budget 2m] [--tasks image,audio]

espeak-ng speaks the audio task's words; on a machine without it (the lent GPU machines have none)
make that data beforehand, where it is, and carry WORKDIR/audio-data along (the same call's data):

    python benchmarks/gpu_tasks.py WORKDIR --write-audio-only

The last line is `GPU TASKS: all N passed on DEVICE` or `GPU TASKS: FAILED: ...`; exit 1 on a failure.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # llmdata / textdata: the tests' offline model and text writers
TASKS = ("image", "tabular", "text", "llm", "segmentation", "detection", "audio")
AUDIO = {"layout": "folders", "clips_per_word": 12, "test": 4, "windows": 4}  # the audio task's spoken words
EPOCH = re.compile(r"^(?:\[\w+\] )?Epoch (\d+): .*Time=([\d.]+)s", re.M)


def write_project(task: str, work: Path, gpu: str) -> tuple[Path, list[str]]:
    """(project, run.py flags) for `task` on data kagtpl writes, rendered by `kagtpl new`'s own
    code (it detects the layout); small plans that a budget cuts."""
    from kagtpl import demo, new, shapes, table
    from kagtpl.sounds import write_sounds

    data, extra = work / f"{task}-data", {}
    if task == "image":
        data, extra = demo.write_digits(data, n_train=1200, n_test=297), {"model": "resnet18", "image_size": 64}
    elif task == "tabular":
        data = table.write_table(data, "binary")
    elif task in ("text", "llm"):
        data, extra = text_data(task, work, data)
    elif task == "segmentation":
        data, extra = shapes.write_shapes(data, "png", 96, 24, 128), {"image_size": 128}
    elif task == "detection":
        data = shapes.write_boxes(data, "wheat", 96, 24, 128)
    elif not (data / "train_audio").is_dir():  # else made beforehand: --write-audio-only
        data = write_sounds(data, **AUDIO)
    kind = "text" if task == "llm" else task
    answers = new.NewAnswers(
        name=task, task=kind, gpu=gpu, data=data, folds=3, epochs=8, dest=work, force=True, **extra
    )
    flags = [] if kind in ("tabular", "text") else ["--no-pretrained"]
    return new.new_project(answers), flags


def text_data(task: str, work: Path, data: Path) -> tuple[Path, dict]:
    """The authors' texts, and a model folder made here offline: a tiny BERT-shaped encoder (text)
    or a tiny Qwen2 decoder that trains LoRA adapters (llm), as tests/llmdata.py makes them."""
    import llmdata
    import pandas as pd
    import textdata

    data = textdata.LAYOUTS["authors"](data)
    texts = pd.read_csv(data / "train.csv")["text"].tolist()
    if task == "llm":
        return data, {"model": "tiny/qwen2", "model_dir": str(llmdata.write_tiny_llm(work / "qwen2-tiny", texts))}
    return data, {"model": "tiny/bert", "model_dir": str(llmdata.write_tiny_encoder(work / "bert-tiny", texts))}


def first_vs_steady(log: str) -> str:
    """Fold 0's first epoch over the median of its later ones, e.g. '1.3x (4.1s vs 3.2s)'."""
    fold0 = log.split("FOLD 1 (")[0]
    times = [float(t) for _, t in EPOCH.findall(fold0)]
    if len(times) < 2:
        return "n/a (one epoch)"
    steady = statistics.median(times[1:])
    if steady < 0.1:  # a table's MLP: epochs too short to compare
        return f"n/a (epochs of {steady:.1f}s)"
    return f"{times[0] / steady:.1f}x ({times[0]:.1f}s vs {steady:.1f}s)"


def budget_share(log: str) -> str | None:
    """The share of the budget run.py's RUN line says the run used ('0.93'), or None without one."""
    share = re.search(r"^RUN: .* = ([\d.]+) of the ", log, re.M)
    return share.group(1) if share else None


def grown_folds(log: str) -> int:
    """The folds growth added: the net's grown seeds, and the boosters' (tree_seeds.py: "FOLD 0 lgbm (seed 2): ...")."""
    return len(re.findall(r"^GROW: seed \d fold \d+ DONE|^FOLD \d+ \w+ \(seed \d\): ", log, re.M))


def budget_used(log: str) -> str:
    """The share of the budget and the grown folds, e.g. '0.93, 4 grown'; '?' where run.py printed no RUN line."""
    return f"{budget_share(log) or '?'}, {grown_folds(log)} grown"


def predict_vs_reserve(log: str) -> str:
    """predict.py's seconds after run.py's `go` (the RUN line) against the reserve train.py planned
    last (its last `reserve Ns`), e.g. '11.0s of 12s'; '?' for what the log lacks."""
    took = re.search(r"^RUN: train [\d.]+s, predict ([\d.]+)s", log, re.M)
    reserves = re.findall(r"reserve ([\d.]+)s", log)
    return f"{took.group(1) + 's' if took else '?'} of {reserves[-1] + 's' if reserves else '?'}"


def check(log: str) -> list[str]:
    """What a task's run.py log lacks: a submission from trained folds, PRECISION, no traceback."""
    problems = []
    if not re.search(r"^SUBMISSION: .* \(\d+ rows, [1-9]\d* fold\(s\) ensembled\)$", log, re.M):
        problems.append("no submission from trained folds")
    if not re.search(r"^PRECISION: \w+ \(", log, re.M):
        problems.append("no PRECISION line")
    if "Traceback (most recent call last)" in log:
        problems.append("a traceback")
    return problems


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", type=Path)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--budget", default="2m")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument(
        "--write-audio-only", action="store_true", help="write WORKDIR/audio-data (needs espeak-ng), then stop"
    )
    args = p.parse_args()
    if args.write_audio_only:
        from kagtpl.sounds import write_sounds

        print(write_sounds(args.work / "audio-data", **AUDIO))
        return 0
    tasks = [t for t in args.tasks.split(",") if t]
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown:
        sys.exit(f"ERROR: --tasks: unknown {unknown}; choose from {','.join(TASKS)}")
    args.work.mkdir(parents=True, exist_ok=True)
    gpu = "auto" if args.device == "cuda" else "cpu"
    # the image tasks' and text's libraries read these at import (image/segmentation/detection train.py
    # set the first, texts.py the second; timm is told only here); a table's scripts import neither, and
    # without them its run.py forks warm under the tests' fork server
    libraries_env = {"NO_ALBUMENTATIONS_UPDATE": "1", "HF_HUB_OFFLINE": "1"}
    failed = []
    print(
        f"{'task':14}{'result':8}{'wall':>8}  {'first epoch vs steady':28}{'budget used':18}{'predict of reserve':20}"
        "submission / problems"
    )
    for task in tasks:
        project, flags = write_project(task, args.work, gpu)
        cmd = [sys.executable, "run.py", "--budget", args.budget, "--device", args.device, *flags]
        t0 = time.time()
        env = {**os.environ, **({} if task == "tabular" else libraries_env)}
        r = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True)
        wall, log = time.time() - t0, r.stdout + r.stderr
        (args.work / f"{task}.log").write_text(log)
        problems = check(log) + ([f"run.py exited {r.returncode}"] if r.returncode else [])
        sub = re.search(r"^SUBMISSION: .* \((\d+ rows, \d+ fold\(s\) ensembled)\)$", log, re.M)
        said = "; ".join(problems) or (sub.group(1) if sub else "")
        result = "FAILED" if problems else "ok"
        row = f"{task:14}{result:8}{wall:>7.0f}s  {first_vs_steady(log):28}{budget_used(log):18}"
        print(f"{row}{predict_vs_reserve(log):20}{said}", flush=True)
        if problems:
            failed.append(task)
    if failed:
        print(f"GPU TASKS: FAILED: {' '.join(failed)} (logs in {args.work})")
        return 1
    print(f"GPU TASKS: all {len(tasks)} passed on {args.device}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
