"""A CPU score for --task audio on held-out generated soundscapes under `run.py --budget 10m`,
against a classical baseline on the same clips and windows, and predict.py's windows per second
on CPU with each fold's CNN in ONNX Runtime (--export onnx) and in torch (--export none).

    python benchmarks/audio.py [--budget 10m] [--clips 40] [--test 12] [--windows 12] [--rounds 2]
                               [--styles kagtpl,unheard] [--flags "--n-mels 64"]

The data is `kagtpl sounds` (training clips by folder, test soundscapes cut into 5 s windows whose
words are known), in two styles, each rendered by `kagtpl new --task audio` as a user would, with
the default model and plan for the CPU, and run on its own:
- `kagtpl`: espeak-ng speaks five words in six voices over pink noise. The audio defaults were
  chosen on this set.
- `unheard`: made differently, so the defaults were not chosen on it (`--style unheard`): eight
  other words, other voices and variants (two of them heard only in the test), wider speeds and
  pitches, mains hum, insect-like tones, brown noise and unlabelled words in the background, and
  up to three words, which may overlap, in a test window.

The baseline: each clip's MFCCs (20 coefficients of the log-mel spectrum, the project's own decoder
and filterbank), their mean and standard deviation over time, and a logistic regression per
word. It is fitted on the training clips of each fold the run finished and scored on the same
validation clips (macro ROC-AUC), then fitted on every clip to score the held-out windows, as
the project's submission is. The project's row is its submission, with predict.py's default TTA
(each window also heard 0.25 s earlier and later); the row below it is predict.py --no-tta on the
same folds. The speed, on the first style's run: predict.py --no-tta (one view a window) run --rounds times with each
--export, alternating, on the run's folds; its windows/s is rows over the seconds of its fold
lines (the loader's decoding included), the better of the runs.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy.fft import dct
from sklearn.linear_model import LogisticRegression

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "generator"))
from _project import cpu_project, held_out_auc, import_project, run_budget, work_dir  # noqa: E402

from kagtpl import sounds  # noqa: E402

MFCC = 20


def get_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--budget", default="10m")
    p.add_argument("--clips", type=int, default=40, help="training clips per word")
    p.add_argument("--test", type=int, default=12, help="held-out soundscapes")
    p.add_argument("--windows", type=int, default=12, help="5 s windows per soundscape")
    p.add_argument("--rounds", type=int, default=2, help="predict.py runs with each --export (0: no speed)")
    p.add_argument("--styles", default="kagtpl,unheard", help="`kagtpl sounds --style` sets, comma-separated")
    p.add_argument("--flags", default="", help="train.py flags for every run: try a recipe on both sets")
    return p.parse_args()


class Mfcc:
    """Mean and standard deviation over time of 20 MFCCs, with the project's decoder and mel filterbank."""

    def __init__(self, audio, config: dict):
        self.audio, self.rate, self.n_fft, self.hop = audio, config["sample_rate"], config["n_fft"], config["hop"]
        self.fb = audio.mel_filterbank(self.n_fft, config["n_mels"], self.rate, config["fmin"], config["fmax"])

    def __call__(self, wave: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(wave.astype(np.float32) / 32768.0)
        spec = torch.stft(x, self.n_fft, self.hop, window=torch.hann_window(self.n_fft), return_complex=True)
        mel = torch.log(torch.matmul(spec.abs().square().T, self.fb) + 1e-6).numpy()  # (frames, mels)
        coeffs = dct(mel, type=2, norm="ortho", axis=1)[:, :MFCC]
        return np.concatenate([coeffs.mean(0), coeffs.std(0)])

    def decode(self, path: Path) -> np.ndarray:
        """The project's decoding: resampled to its rate, as int16 (what its cache holds)."""
        return self.audio.to_int16(self.audio.read_audio(str(path), self.rate))

    def clip(self, path: Path) -> np.ndarray:
        return self(self.decode(path))

    def windows(self, path: Path, ends: list[int], seconds: int) -> list[np.ndarray]:
        """The features of each window ending at `ends` (seconds) of one recording, decoded once."""
        wave, size = self.decode(path), seconds * self.rate
        parts = [wave[(end - seconds) * self.rate : end * self.rate] for end in ends]
        return [self(np.pad(part, (0, size - len(part)))) for part in parts]


def fit_predict(x_fit: np.ndarray, y_fit: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A standardised logistic regression per label: probabilities (rows, labels)."""
    mean, std = x_fit.mean(0), x_fit.std(0) + 1e-6
    probs = []
    for j in range(y_fit.shape[1]):
        model = LogisticRegression(max_iter=2000, C=1.0).fit((x_fit - mean) / std, y_fit[:, j])
        probs.append(model.predict_proba((x - mean) / std)[:, 1])
    return np.stack(probs, 1)


def windows_per_s(project: Path, export: str) -> tuple[float, str]:
    """predict.py --device cpu --no-tta --export EXPORT: rows over the seconds of its fold lines, and its log."""
    command = [sys.executable, "predict.py", "--device", "cpu", "--no-tta", "--export", export]
    run = subprocess.run([*command, "--submission", f"{export}.csv"], cwd=project, capture_output=True, text=True)
    if run.returncode:
        sys.exit(f"predict.py --export {export} exited {run.returncode}: {run.stderr[-2000:]}")
    folds = re.findall(r"^PREDICT: model_fold\d+\.pth -> (\d+) rows in ([\d.]+)s", run.stdout, re.M)
    return sum(int(n) for n, _ in folds) / sum(float(s) for _, s in folds), run.stdout


def baseline(project: Path, m, data: Path, labels: list, solution: pd.DataFrame) -> tuple[float, float, float]:
    """The MFCC baseline's OOF macro AUC on the run's folds, its held-out windows' macro AUC, and its
    wall seconds. `m`: the project's audio and train modules (its decoder, filterbank and metric)."""
    t0 = time.time()
    ckpt = torch.load(sorted((project / "output").glob("model_fold*.pth"))[0], weights_only=True)
    features = Mfcc(m.audio, ckpt["config"])
    clips = sorted((data / "train_audio").glob("*/*.ogg"))
    names = [f"{p.parent.name}/{p.name}" for p in clips]
    x = np.stack([features.clip(p) for p in clips])
    y = np.array([[float(p.parent.name == w) for w in labels] for p in clips])
    oof = pd.concat([pd.read_csv(f) for f in sorted((project / "output").glob("oof_fold*.csv"))])
    truth, probs = [], []
    for k in sorted(oof["fold"].unique()):
        valid = set(oof.loc[oof["fold"] == k, "clip"])
        fit = np.array([n not in valid for n in names])
        truth.append(y[~fit])
        probs.append(fit_predict(x[fit], y[fit], x[~fit]))
    oof_auc = m.train.macro_auc(np.concatenate(truth), np.concatenate(probs))
    ends: dict[str, list[int]] = {}  # recording -> its windows' end seconds, in the solution's order
    for row_id in solution["row_id"]:
        recording, end = re.fullmatch(r"(.+)_(\d+)", row_id).groups()
        ends.setdefault(recording, []).append(int(end))
    folder, found = data / "test_soundscapes", {}
    for recording, its_ends in ends.items():
        for end, feats in zip(its_ends, features.windows(folder / f"{recording}.ogg", its_ends, 5), strict=True):
            found[f"{recording}_{end}"] = feats
    test = np.stack([found[row_id] for row_id in solution["row_id"]])
    held_out = m.train.macro_auc(solution[labels].to_numpy(), fit_predict(x, y, test))
    return oof_auc, held_out, time.time() - t0


def score(work: Path, style: str, args: argparse.Namespace) -> tuple[Path, list]:
    """One style's set: written, rendered, run under the budget and scored beside the baseline.
    Returns the project and the table's rows."""
    data = sounds.write_sounds(work / style, "folders", args.clips, args.test, args.windows, seed=7, style=style)
    solution = pd.read_csv(work / f"{style}_solution.csv")
    labels = list(solution.columns[1:])
    project = cpu_project(work, f"birds_{style}", "audio", data)
    log, wall = run_budget(project, args.budget, tuple(shlex.split(args.flags)))
    oof_auc = float(re.search(r"^OOF: .*AUC=([\d.]+) over", log, re.M)[1])
    m = import_project(project, ("audio", "train"))
    sub = pd.read_csv(project / "output" / "submission.csv")
    rows = [(f"{style}: timm CNN (kagtpl audio)", oof_auc, held_out_auc(m.train, solution, sub, labels), wall)]
    command = [sys.executable, "predict.py", "--device", "cpu", "--no-tta", "--submission", "one-view.csv"]
    subprocess.run(command, cwd=project, check=True, capture_output=True)
    one_view = pd.read_csv(project / "output" / "one-view.csv")
    rows.append(("  one view a window (--no-tta)", oof_auc, held_out_auc(m.train, solution, one_view, labels), wall))
    rows.append(("  MFCC mean/std + logistic regression", *baseline(project, m, data, labels, solution)))
    folds = sorted(int(k) for k in pd.read_csv(project / "output" / "oof.csv")["fold"].unique())
    clips, words = len(list((data / "train_audio").glob("*/*.ogg"))), len(labels)
    rows.append((f"  ({clips} training clips of {words} words, {len(solution)} windows; folds {folds})",))
    return project, rows


def main() -> None:
    args = get_args()
    work = work_dir("kagtpl-audio-bench-")
    projects, table = [], []
    for style in args.styles.split(","):
        project, rows = score(work, style, args)
        projects.append(project)
        table += rows
    print(f"\n{'':46s} {'OOF AUC':>8s} {'held-out AUC':>13s} {'wall s':>7s}")
    for name, *numbers in table:
        print(f"{name:46s} {numbers[0]:8.4f} {numbers[1]:13.4f} {numbers[2]:7.0f}" if numbers else name)
    if args.rounds:
        print_speed(projects[0], args.rounds)


def print_speed(project: Path, rounds: int) -> None:
    """predict.py --no-tta on `project`'s folds, `rounds` times with each --export, alternating."""
    speed, said = {"none": [], "onnx": []}, ""
    for _ in range(rounds):
        for export in speed:
            rate, said = windows_per_s(project, export)
            speed[export].append(rate)
    folds = len(list((project / "output").glob("model_fold*.pth")))
    print("\n" + next(line for line in said.splitlines() if line.startswith("EXPORT:")))
    runs = {k: " ".join(f"{r:.1f}" for r in v) for k, v in speed.items()}
    torch_rate, onnx_rate = max(speed["none"]), max(speed["onnx"])
    print(f"predict.py on CPU, {folds} fold(s): windows/s torch {torch_rate:.1f} (runs: {runs['none']})")
    print(f"predict.py on CPU, {folds} fold(s): windows/s ONNX Runtime {onnx_rate:.1f} (runs: {runs['onnx']})")
    print(f"ONNX Runtime / torch windows/s: {onnx_rate / torch_rate:.2f}")


if __name__ == "__main__":
    main()
