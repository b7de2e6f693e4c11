"""Audio predict.py's TTA on held-out windows: the macro ROC-AUC of one view a window
(--no-tta) against the window averaged with it shifted --tta-shift seconds earlier and later,
for each shift, on the same checkpoints, over several `kagtpl sounds` seeds.

    python benchmarks/audio_tta.py [--seeds 11 12 13] [--shifts 0.25 0.5 1 2.5] [--clips 20] [--test 12]

Per seed: `kagtpl sounds` (clips by folder; held-out soundscapes of --windows 5 s windows whose
words are known), a project rendered at HEAD, trained on CPU as tests/test_audio.py trains it
(2 folds x --epochs of resnet18 on 64 mels, hop 1024), then predict.py once with --no-tta and once
with --tta at each shift. The words of `kagtpl sounds` lie wholly inside their windows, so what a
shifted view adds is the neighbouring window's audio: the table shows how wide a shift can be
before that costs more than it gains.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pandas as pd
from _project import held_out_auc, import_project, render, work_dir

from kagtpl import sounds

TRAIN = ["--device", "cpu", "--n-mels", "64", "--hop", "1024", "--workers", "1", "--lr", "3e-3"]


def get_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, nargs="+", default=[11, 12, 13], help="kagtpl sounds seeds: a project each")
    p.add_argument("--shifts", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.5], help="--tta-shift seconds")
    p.add_argument("--clips", type=int, default=20, help="training clips per word (5 words)")
    p.add_argument("--test", type=int, default=12, help="held-out soundscapes")
    p.add_argument("--windows", type=int, default=12, help="5 s windows per soundscape")
    p.add_argument("--epochs", type=int, default=12)
    return p.parse_args()


def run(project: Path, *args: str) -> None:
    done = subprocess.run([sys.executable, *args], cwd=project, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{' '.join(args)} exited {done.returncode}: {done.stdout[-2000:]}{done.stderr[-2000:]}")


def seed_row(work: Path, seed: int, args) -> dict[str, float]:
    """One seed's project, trained once, and the held-out macro AUC of each way of predicting it."""
    data = sounds.write_sounds(work / f"sounds{seed}", "folders", args.clips, args.test, args.windows, seed=seed)
    solution = pd.read_csv(work / f"sounds{seed}_solution.csv")
    labels = list(solution.columns[1:])
    project = render(work / f"birds{seed}", "audio", data_dir=str(data), folds=2, epochs=args.epochs)
    run(project, "train.py", *TRAIN, "--patience", str(args.epochs))
    train = import_project(project, ("train",)).train
    ways = {"one view": ["--no-tta"], **{f"shift {s:g} s": ["--tta", "--tta-shift", str(s)] for s in args.shifts}}
    scores = {}
    for k, (name, flags) in enumerate(ways.items()):
        run(project, "predict.py", "--device", "cpu", "--workers", "1", "--submission", f"way{k}.csv", *flags)
        scores[name] = held_out_auc(train, solution, pd.read_csv(project / "output" / f"way{k}.csv"), labels)
    return scores


def main() -> None:
    args = get_args()
    work = work_dir("kagtpl-audio-tta-")
    rows = {seed: seed_row(work, seed, args) for seed in args.seeds}
    table = pd.DataFrame(rows).T
    table.loc["mean"] = table.mean()
    n = args.test * args.windows
    print(f"\nheld-out macro ROC-AUC, {n} windows a seed; 2 folds x {args.epochs} epochs on {5 * args.clips} clips")
    print(table.to_string(float_format=lambda v: f"{v:.4f}"))


if __name__ == "__main__":
    main()
