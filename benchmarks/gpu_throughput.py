"""The generated image train.py against a bare hand loop on one card, in one run (issue 46):
the same data, augmentation, model, batch, AMP and channels_last.

For each contender it reports:
- steady samples/s (the median of epochs 2..E, training only) and its ratio to the hand loop;
- the time from process start to the first training step (train.py's `GPU Memory Used:` line);
- the first epoch against a steady one (training time: the hand loop's epoch is its train pass);
- nvidia-smi's GPU utilisation over fold 0, validation included (sampled every 200 ms; CUDA only).

train.py runs with --batch-size (the probe skipped: both sides train the same batch), eagerly and,
on CUDA, with --compile on and with --cudnn-benchmark (both off by default: the two rows show why;
--variants none leaves them out).

    python benchmarks/gpu_throughput.py                                   # resnet50 224 px on the GPU
    python benchmarks/gpu_throughput.py --device cpu --model resnet18 --size 32 --images 512 --batch 32

Goals on a card: steady >= 0.98 of the hand loop; first epoch <= 1.5x a steady one; GPU
utilisation >= 85% over a fold.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from _project import import_project, render, work_dir

from kagtpl import demo, new

EPOCH = re.compile(r"^Epoch (\d+): .*Throughput=([\d.]+) samples/s")
GOALS = {"steady": 0.98, "first": 1.5, "util": 85.0}


def write_images(dest: Path, n: int) -> Path:
    """The digits in the dog-breed layout, their 1,500 training images repeated (new ids) to `n`:
    the throughput, not the score, is measured, and the augmentation differs each time anyway."""
    data = demo.write_digits(dest, n_train=1500, n_test=100)
    labels = pd.read_csv(data / "labels.csv")
    rows = []
    for k in range(n):
        row = labels.iloc[k % len(labels)]
        new_id = f"{row['id']}_{k // len(labels)}"
        if k >= len(labels):
            shutil.copyfile(data / "train" / f"{row['id']}.jpg", data / "train" / f"{new_id}.jpg")
        rows.append({"id": new_id if k >= len(labels) else row["id"], "breed": row["breed"]})
    pd.DataFrame(rows).to_csv(data / "labels.csv", index=False)
    return data


class Utilisation:
    """nvidia-smi's utilization.gpu every 200 ms, each reading timestamped (nothing on a CPU run)."""

    def __init__(self, device: str):
        self.readings: list[tuple[float, float]] = []
        smi = shutil.which("nvidia-smi")
        self.proc = None
        if device == "cuda" and smi:
            cmd = [smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200"]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.strip().split(",")[0].strip().isdigit():
                self.readings.append((time.time(), float(line.split(",")[0])))

    def mean(self, t0: float, t1: float) -> float | None:
        inside = [u for t, u in self.readings if t0 <= t <= t1]
        return statistics.mean(inside) if inside else None

    def stop(self) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait()


def run_train(project: Path, args, out: str, *extra: str) -> dict:
    """train.py on fold 0 with the batch fixed; what its log says, with when it said it."""
    cmd = [sys.executable, "train.py", "--device", args.device, "--no-pretrained", "--model", args.model]
    cmd += ["--image-size", str(args.size), "--batch-size", str(args.batch), "--folds", "2", "--train-folds", "1"]
    cmd += ["--epochs", str(args.epochs), "--patience", str(args.epochs), "--out-dir", out, "--budget", "", *extra]
    util = Utilisation(args.device)
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen, rates, times = {}, [], {}
    for line in proc.stdout:
        now = time.time()
        for key in ("GPU Memory Used:", "FOLD 0 (", "FOLD 0 DONE", "COMPILE:"):
            if line.startswith(key):
                seen.setdefault(key, (now, line.strip()))
        if m := EPOCH.match(line):
            rates.append(float(m.group(2)))
            times[int(m.group(1))] = now
    if proc.wait() != 0:
        raise SystemExit(f"train.py {' '.join(extra)} failed: see {project / out / 'train.log'}")
    util.stop()
    steady = statistics.median(rates[1:])
    start = seen.get("FOLD 0 (", (t0,))[0]
    end = seen.get("FOLD 0 DONE", (time.time(),))[0]
    return {
        "steady": steady,
        "first_step_s": seen["GPU Memory Used:"][0] - t0,
        "first": steady / rates[0],  # train time per sample: epoch 1's over a steady epoch's
        "util": util.mean(start, end),
        "compile": seen.get("COMPILE:", (0, ""))[1],
    }


def hand_loop(project: Path, args, n_train: int) -> dict:
    """The same work written by hand: the project's decode cache, augmentation and model, a plain
    DataLoader with the project's loader settings, AdamW, AMP as train.py picks it, channels_last on CUDA."""
    m = import_project(project, ("train", "images", "hardware", "gpu"))
    device = torch.device(args.device)
    labels = pd.read_csv(project.parent / "data" / "labels.csv")
    paths = [str(project.parent / "data" / "train" / f"{i}.jpg") for i in labels["id"]]
    cache = m.images.image_cache(paths, paths, args.size, project / "out-eager" / "cache", "train", 1)
    classes = sorted(labels["breed"].unique())
    targets = labels["breed"].map({c: k for k, c in enumerate(classes)}).to_numpy()
    rows = np.arange(n_train)
    dataset = m.train.ImageDataset(cache, rows, targets, m.train.make_transforms(args.size, True, True))
    cuda = device.type == "cuda"
    loader = m.images.make_loader(dataset, args.batch, True, m.hardware.loader_settings(m.hardware.usable_cpus(), cuda))
    model = m.train.build_model({"model": args.model}, len(classes)).to(device)
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    mode, _ = m.gpu.training_amp("auto", torch.cuda.get_device_capability() if cuda else (0, 0))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode)
    scaler = torch.amp.GradScaler(enabled=mode == "fp16")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)  # train.py's AdamW: the same work
    rates = []
    for _ in range(args.epochs):
        t0, seen = time.perf_counter(), 0
        model.train()
        for x, y in loader:
            x = x.to(device, non_blocking=True, memory_format=torch.channels_last if cuda else torch.preserve_format)
            y = y.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = torch.nn.functional.cross_entropy(model(m.images.normalize(x)), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            seen += len(y)
        if cuda:
            torch.cuda.synchronize()
        rates.append(seen / (time.perf_counter() - t0))
    steady = statistics.median(rates[1:])
    return {"steady": steady, "first_step_s": None, "first": steady / rates[0], "util": None, "amp": mode}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--model", default="resnet50")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--images", type=int, default=8000, help="fold 0 trains on half")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--work", type=Path, default=None, help="where the project goes (default: a temporary folder)")
    p.add_argument(
        "--variants", default="compile,cudnn",
        help="train.py's CUDA variants beside its default run and the hand loop: compile (--compile on, ~90 s "
        "to its first step), cudnn (--cudnn-benchmark); 'none' for the default run alone (a short lent call)",
    )  # fmt: skip
    args = p.parse_args()
    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
    work = args.work or work_dir("kagtpl-gpu-throughput-")
    data = write_images(work / "data", args.images)
    # rendered for the card it runs on, as `kagtpl new --gpu auto` on that machine would: a project
    # rendered for the CPU warned on the card that its --gpu was not this card
    gpu = new.detect_gpu() if args.device == "cuda" else "cpu"
    project = render(work / "proj", "image", data_dir=str(data), model=args.model, image_size=args.size, gpu=gpu)
    runs = {"train.py": run_train(project, args, "out-eager", "--compile", "off")}
    variants = args.variants.split(",") if args.device == "cuda" else []
    if "compile" in variants:
        runs["train.py --compile on"] = run_train(project, args, "out-compile", "--compile", "on")
    if "cudnn" in variants:
        runs["train.py --cudnn-benchmark"] = run_train(
            project, args, "out-cudnn", "--compile", "off", "--cudnn-benchmark"
        )
    hand = hand_loop(project, args, args.images // 2)
    runs["hand loop"] = hand
    card = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(
        f"gpu throughput: {args.model} {args.size}px, {args.images} images (fold 0 trains on {args.images // 2}), "
        f"batch {args.batch}, AMP {hand['amp']}, channels_last {args.device == 'cuda'}, {args.epochs} epochs, "
        f"{card}, torch {torch.__version__}"
    )
    print(f"{'run':30}{'steady samples/s':>17}{'vs hand loop':>14}{'start->1st step':>17}{'1st epoch/steady':>18}"
          f"{'GPU util (fold)':>17}")  # fmt: skip
    for name, r in runs.items():
        util = "n/a" if r["util"] is None else f"{r['util']:.0f}%"
        start = "-" if r["first_step_s"] is None else f"{r['first_step_s']:.1f}s"
        ratio = r["steady"] / hand["steady"]
        print(f"{name:30}{r['steady']:>17.0f}{ratio:>13.3f}x{start:>17}{r['first']:>17.2f}x{util:>17}")
    ours = runs["train.py"]
    checks = [
        f"steady >= {GOALS['steady']} of the hand loop: {ours['steady'] / hand['steady']:.3f}",
        f"first epoch <= {GOALS['first']}x steady: {ours['first']:.2f}x",
        f"GPU util >= {GOALS['util']:.0f}%: " + ("n/a (no GPU)" if ours["util"] is None else f"{ours['util']:.0f}%"),
    ]
    print("goals: " + "; ".join(checks))
    print(f"train.py's own choice: {ours['compile']}")


if __name__ == "__main__":
    main()
