"""The batch probe on every task, through the fake GPU (tests/fake_gpu.py): each task's real
Competition, loaders, model and predict, with the card's memory and clock behind the one seam.

The first real GPU run (an H100, issue 46) found that audio crashed here before its first epoch:
the eval batch was sized on a *training* batch (random crops, (B, samples)) fed to predict,
which expects validation's grid of windows (B, windows, samples). Segmentation's tiles,
detection's images and text's lengths differ between the two loaders too. These tests run
`probe.autoscale` end to end, eval batch included, on each task's own data.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import textdata
import torch
from fake_gpu import FakeGpu

from conftest import import_project, render
from kagtpl import new, shapes
from kagtpl.sounds import write_sounds

MODULES = ("train", "engine", "probe", "gpu", "hardware", "artifacts")


def image_project(root: Path, digits_dir: Path):
    return render(root / "proj", data_dir=str(digits_dir)), ["--no-pretrained"]


def segmentation_project(root: Path, _):
    data = shapes.write_shapes(root / "data", "png", 24, 6, 96)
    answers = new.NewAnswers(name="seg", task="segmentation", gpu="cpu", data=data, dest=root, image_size=64)
    return new.new_project(answers), ["--no-pretrained", "--workers", "0"]


def detection_project(root: Path, _):
    data = shapes.write_boxes(root / "data", "wheat", 24, 6, 96)
    answers = new.NewAnswers(name="det", task="detection", gpu="cpu", data=data, dest=root)
    return new.new_project(answers), ["--no-pretrained", "--workers", "0"]


def audio_project(root: Path, _):
    data = write_sounds(root / "data", "folders", clips_per_word=4, test=2, windows=3)
    proj = render(root / "proj", task="audio", data_dir=str(data))
    return proj, ["--no-pretrained", "--n-mels", "64", "--hop", "1024", "--workers", "0"]


def text_project(root: Path, _):
    data = textdata.LAYOUTS["authors"](root / "data")
    answers = {
        "task": "text",
        "data_dir": str(data),
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "model_dir": str(textdata.one_layer_minilm()),
        "text_cols": "text",
        "target": "author",
        "problem": "multiclass",
        "submission": "probs",
        "metric": "logloss",
        "id_col": "id",
    }
    return render(root / "proj", **answers), []


PROJECTS = {
    "image": image_project,
    "segmentation": segmentation_project,
    "detection": detection_project,
    "audio": audio_project,
    "text": text_project,
}


# The fake card's memory a row: text's real MiniLM steps on CPU at 64 rows took half the test's
# minute; at 0.5 GB a row the 24 GB card ended the probe at 32 (the test took 118 s in the full
# suite); at 1.5 GB it ends at 8-16 rows, past the first doubling (the eval batch's path is the same)
GB_PER_ROW = {"text": 1.5}


def rows_of(inputs) -> int:
    """Rows in a model call: a tensor's first dimension, or a detector's list of images."""
    first = inputs[0]
    return len(first) if isinstance(first, (list, tuple)) else first.shape[0]


@pytest.mark.slow  # renders a project and builds its Competition (5-30 s each)
@pytest.mark.parametrize("task", list(PROJECTS))
def test_the_probe_and_the_eval_batch_run_on_every_tasks_own_batches(task, tmp_path, digits_dir, monkeypatch, capsys):
    """probe.autoscale on the task's real Competition on a fake 24 GB card: the training batch is
    probed on training batches and the eval batch on *validation* batches through the task's own
    predict (audio's training crops crashed it: IndexError in the mel front end). Memory follows
    the rows each model call really ran, so a validation batch of 4 clips x 3 windows is charged
    for 12 windows."""
    proj, flags = PROJECTS[task](tmp_path, digits_dir)
    m = import_project(proj, MODULES)
    gpu = FakeGpu(GB_PER_ROW.get(task, 0.01), total_gb=24.0, spike_gb=0.1).install(monkeypatch)
    out = tmp_path / "out"
    out.mkdir()  # runflags.begin makes it in a real run
    args = m.train.get_args(["--device", "cpu", "--out-dir", str(out), *flags])
    args.signature = m.artifacts.run_signature(args)  # what runflags.begin sets before the data is read
    machine = m.engine.make_machine(torch.device("cpu"), "off", m.hardware.loader_settings(1, False), False)
    machine = dataclasses.replace(machine, monitor=m.gpu.GpuMonitor(torch.device("cuda")))
    if task == "text":  # a text Competition sizes max_len by the card's profile
        comp = m.train.Competition(args, m.hardware.PROFILES["cpu"], machine.device)
    else:
        comp = m.train.Competition(args, machine)
    n = len(comp.train)
    fold = comp.fold(0, np.arange(n // 2, n), np.arange(n // 2))
    model = comp.build_model(fold)
    calls = []

    def charge(module, inputs, output):  # the fake card's memory and time follow each real call
        calls.append((module.training, rows_of(inputs)))
        gpu.forward(rows_of(inputs), module.training)

    model.register_forward_hook(charge)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batching = m.engine.Batching(2, 1, 1e-3)
    capsys.readouterr()
    m.probe.autoscale(comp, fold, (n - n // 2) * 30, model, opt, machine, batching, 1e-3, clock=gpu.clock)
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("BATCH PROBE: batch 2 x 1 -> ") for line in lines), lines
    eval_line = next(line for line in lines if line.startswith("EVAL BATCH: "))
    size = int(re.match(r"EVAL BATCH: (\d+) ", eval_line).group(1))
    assert batching.eval_size == size >= 1, lines
    # the eval probe's forward ran in eval mode on a validation batch: the rows the model saw are
    # validation's own (audio: clips x windows; the others: rows), never a training batch's
    evals = [rows for training, rows in calls if not training]
    assert evals, calls
    valid_batch = next(iter(comp.loader(fold.valid, size, train=False)))
    first = valid_batch[0]
    expected = first.shape[0] * first.shape[1] if task == "audio" else len(first)
    assert evals[-1] == expected, (evals, expected)
