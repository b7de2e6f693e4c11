"""The CUDA paths, checked on a machine without a GPU (issue 22): each numbered item of
docs/gpu-check.md's "What a read of the CUDA paths found" has a test here that failed before its
fix. GPU-only behaviour goes through tests/fake_gpu.py's one seam (strict fakes of the torch.cuda
functions the project calls, with PyTorch's own argument checks and the caching allocator's
rules); CatBoost and XGBoost get their real GPU parameters; fp16 numerics run for real on CPU;
DDP runs for real under torchrun with gloo."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from fake_gpu import GB, FakeCuda, FakeGpu, ProbeBench

from conftest import RUN_ENV, render, run_script

# what torch 2.14.1's CUDA 13.0 wheel is built for (torch.cuda.get_arch_list()): no sm_60, no sm_70
CU130_ARCHS = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


# ----------------------------------------------------------------------------- the fakes' fidelity


def test_fake_cuda_checks_arguments_with_pytorchs_own_code(monkeypatch):
    cuda = FakeCuda("t4").install(monkeypatch)
    with pytest.raises(ValueError, match="Expected a torch.device with a specified index or an integer, but got:cuda"):
        torch.cuda.set_per_process_memory_fraction(0.5, torch.device("cuda"))  # item 1's call
    with pytest.raises(TypeError, match="Invalid type for fraction argument"):
        torch.cuda.set_per_process_memory_fraction(1, 0)
    with pytest.raises(ValueError, match="Invalid fraction value"):
        torch.cuda.set_per_process_memory_fraction(1.5, 0)
    with pytest.raises(AssertionError, match="Invalid device id"):
        torch.cuda.get_device_properties(1)  # one card: cuda:1 does not exist
    with pytest.raises(ValueError, match="Expected a cuda device"):
        torch.cuda.mem_get_info(torch.device("cpu"))
    torch.cuda.set_per_process_memory_fraction(0.5, 0)
    assert cuda.fraction == 0.5
    assert torch.cuda.get_device_capability(torch.device("cuda")) == (7, 5)  # optional index: the current card


def test_fake_allocator_keeps_freed_blocks_reserved_and_resets_the_peak_to_reserved():
    cuda = FakeCuda("a10", total_gb=24, context_gb=0.5)
    work = cuda.malloc(3 * GB)
    cuda.free(work)
    assert cuda.memory_reserved(0) == 3 * GB and cuda.allocated == 0  # cached, still reserved
    cuda.reset_peak_memory_stats(0)
    assert cuda.max_memory_reserved(0) == 3 * GB  # reset to the current reserved memory, not 0
    small = cuda.malloc(1 * GB)  # served from the cache: reserved does not grow
    assert cuda.memory_reserved(0) == 3 * GB
    cuda.free(small)
    cuda.empty_cache()
    assert cuda.memory_reserved(0) == 0 and cuda.mem_get_info(0) == (int(23.5 * GB), 24 * GB)
    cuda.malloc(20 * GB)
    with pytest.raises(torch.cuda.OutOfMemoryError, match="CUDA out of memory"):
        cuda.malloc(4 * GB)  # 24 - 0.5 context - 20: after releasing the (empty) cache, still no room
    cuda.set_per_process_memory_fraction(0.5, 0)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        cuda.malloc(1 * GB)  # past this process's fraction


# ----------------------------------------------------------------------------- item 1


def test_item1_memory_share_caps_the_allocator_of_the_card_by_index(project_modules, monkeypatch):
    """tune.py --workers: GpuMonitor on torch.device('cuda') (no index) capped the allocator with
    set_per_process_memory_fraction(cap, device): PyTorch's ValueError, every trial failed."""
    m = project_modules
    cuda = FakeCuda("t4").install(monkeypatch)
    monkeypatch.setenv(m.gpu.SHARE_ENV, "0.5")
    monitor = m.gpu.GpuMonitor(torch.device("cuda"))
    assert cuda.fraction == pytest.approx((0.5 * cuda.total - 0.5 * GB) / cuda.total)
    used, total, _ = monitor.peak()
    assert total == pytest.approx(cuda.total / GB / 2) and used == pytest.approx(0.5)  # its own context only
    with pytest.raises(torch.cuda.OutOfMemoryError):
        cuda.malloc(0.5 * cuda.total)  # past its share: a real OOM, as on a full card


# ----------------------------------------------------------------------------- items 2 and 3: tables


@pytest.fixture(scope="module")
def price_table(tmp_path_factory):
    """A tabular regression project whose target is in the hundreds of thousands (diabetes x 1000):
    above fp16's 65504, like raw prices and counts."""
    from kagtpl import table

    root = tmp_path_factory.mktemp("prices")
    data = table.write_table(root / "data", "regression")
    train = pd.read_csv(data / "train.csv")
    train["target"] = train["target"] * 1000.0
    train.to_csv(data / "train.csv", index=False)
    sample = pd.read_csv(data / "sample_submission.csv")
    sample["target"] = 150_000.0
    sample.to_csv(data / "sample_submission.csv", index=False)
    args = ["new", "prices", "--task", "tabular", "--gpu", "cpu", "--data", str(data), "--folds", "2"]
    r = subprocess.run([sys.executable, "-m", "kagtpl", *args], cwd=root, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return root / "prices"


def in_project(project, code: str) -> subprocess.CompletedProcess:
    """Python code run in a rendered project (its modules importable), in a process of its own."""
    return run_script(project, "-c", textwrap.dedent(code), check=False)


def in_a_process(test):
    """A test that runs in_project: slow (a process of the project's code; in a worker with no fork
    server yet, its start cost 6-7 s, and these four tests took 24-27 s of the fast tier's 219-227 s
    summed on 2 cores) and onecore (one process at a time, nothing timed)."""
    return pytest.mark.slow(pytest.mark.onecore(test))


@in_a_process
def test_item2_catboost_and_xgboost_take_their_gpu_parameters(price_table):
    """CatBoost checks its arguments before it opens a device: with callbacks and task_type=GPU it
    raised 'User defined callbacks are not supported for GPU' (the table's train.py crashed). Now
    its arguments pass, and on this machine the fit gets as far as opening the (absent) device."""
    r = in_project(
        price_table,
        """
        import warnings
        import numpy as np, pandas as pd
        from machinery import boosters, trees
        rng = np.random.default_rng(0)
        x = pd.DataFrame(rng.random((300, 4)), columns=list("abcd"))
        y = (x["a"] > 0.5).astype(int).to_numpy()
        data = (x, y, x, y)
        params = {"rounds": 30, "early_stop": 5, "lr": 0.1}
        try:
            boosters.fit("cat", params, "binary", "auc", data, "cuda", 2, 0, lambda: False)
            print("CAT: fitted")
        except Exception as e:
            print("CAT:", type(e).__name__, e)
        print("CATNOTE:", boosters.gpu_fit_notes("cat", "cuda", "binary", "auc"))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            model, classes, kept = boosters.fit("xgb", params, "binary", "auc", data, "cuda", 2, 0, lambda: False)
            val = trees.predict_frame(trees.Fold("xgb", model, {}, *trees.columns_of(classes, 2)), x)
        print("XGB:", val.shape, kept, [str(w.message)[:80] for w in seen if "mismatched" in str(w.message)])
        """,
    )
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    cat = next(x for x in out.splitlines() if x.startswith("CAT:"))
    assert "callbacks" not in cat, cat  # the bug
    assert cat == "CAT: fitted" or "CUDA" in cat or "GPU" in cat, cat  # a card: fitted; none: the device open fails
    note = next(x for x in out.splitlines() if x.startswith("CATNOTE:"))
    assert "early stopping on Logloss (its GPU has no AUC)" in note and "gpu_ram_part 0.5" in note
    assert "XGB: (300, 2)" in out and out.rstrip().endswith("[]")  # no fallback warning when predicting


@in_a_process
def test_item3_table_regression_output_is_fp32_under_fp16_autocast(price_table):
    """head(x) * y_std + y_mean under fp16 autocast stayed fp16: a target above 65504 was inf."""
    r = in_project(
        price_table,
        """
        import torch
        from train import TabularMLP
        torch.manual_seed(0)
        model = TabularMLP(4, [], 1, [16], 0.0, y_mean=150_000.0, y_std=70_000.0).eval()
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(torch.randn(64, 4), torch.zeros(64, 0, dtype=torch.long))
        print("OUT:", out.dtype, bool(torch.isfinite(out).all()), float(out.abs().max()))
        """,
    )
    assert r.returncode == 0, r.stderr
    assert "OUT: torch.float32 True" in r.stdout, r.stdout


@pytest.mark.slow
def test_item3_fp16_training_on_a_price_target_gives_a_finite_oof(price_table):
    """--amp fp16 --device cpu: real half-precision numerics. Before the fix every prediction was
    inf, the GradScaler skipped every step and no fold produced a finite val loss."""
    log = run_script(
        price_table,
        "train.py",
        "--device",
        "cpu",
        "--amp",
        "fp16",
        "--models",
        "mlp",
        "--epochs",
        "4",
        "--out-dir",
        "fp16",
    ).stdout
    assert "not finite" not in log and "never produced a finite val loss" not in log, log[-3000:]
    rmse = float(re.search(r"^OOF: rmse=([\d.]+) over", log, re.M).group(1))
    assert np.isfinite(rmse) and rmse < 100_000  # the target's std is ~77,000: the MLP learned something
    pred = run_script(price_table, "predict.py", "--device", "cpu", "--out-dir", "fp16").stdout
    assert "PRECISION: off (CPU (trained in fp16): fp32)" in pred


# ----------------------------------------------------------------------------- item 4


@pytest.mark.parametrize(
    "card,trained,expected",
    [
        ("t4", "fp32", "fp32"),  # mDeBERTa forced to fp32 on a T4: fp16 would be NaN in every fold
        ("t4", "fp16", "fp16"),
        ("t4", "bf16", "fp32"),  # trained on an A100, predicted on a T4: no native bf16, fp16 too narrow
        ("a100", "bf16", "bf16"),
        ("a100", "fp16", "fp16"),
        ("a100", "off", "fp32"),
        ("t4", None, "fp32"),  # a checkpoint that does not say
    ],
)
def test_item4_prediction_uses_the_checkpoints_precision(project_modules, monkeypatch, capsys, card, trained, expected):
    m = project_modules
    FakeCuda(card).install(monkeypatch)
    checkpoints = [("model_fold0.pth", {"config": {"amp": trained}})] if trained else [("f.pth", {"config": {}})]
    machine = m.engine.inference_machine(torch.device("cuda"), checkpoints, {}, channels_last=False)
    assert machine.amp.mode == expected
    assert capsys.readouterr().out.startswith(f"PRECISION: {expected} (")
    cpu = m.engine.inference_machine(torch.device("cpu"), checkpoints, {}, channels_last=False)
    assert cpu.amp.mode == "off" and not cpu.amp.enabled
    mixed = [*checkpoints, ("model_fold1.pth", {"config": {"amp": "fp32" if trained != "fp32" else "fp16"}})]
    assert m.engine.inference_machine(torch.device("cuda"), mixed, {}, channels_last=False).amp.mode == "fp32"


def test_item4_every_predict_py_asks_for_the_checkpoints_precision():
    """predict.py files chose AMP with "auto" (this card's training rule). Every task's predict.py
    and serve.py ensemble now take the checkpoints' precision: through machinery/prediction.py's
    `machine` and `serve_folds`, or engine.inference_machine itself (text, tabular)."""
    from conftest import ROOT

    core = (ROOT / "template" / "machinery" / "prediction.py").read_text()
    assert core.count("inference_machine(run.device, run.checkpoints,") == 1  # prediction.machine
    assert core.count("inference_machine(device, checkpoints,") == 1  # prediction.serve_folds
    for task in ("image", "audio", "segmentation", "detection", "text", "tabular"):
        source = (ROOT / "template" / f"{{% if task == '{task}' %}}predict.py{{% endif %}}").read_text()
        assert "make_machine(" not in source, task
        if task in ("text", "tabular"):
            assert "engine.inference_machine(device, checkpoints," in source, task
        else:
            assert "prediction.machine(args, run)" in source and "prediction.serve_folds(" in source, task


# ----------------------------------------------------------------------------- items 5, 6, 7: the probe


def _probe(m, gpu, monkeypatch):
    """probe.probe_batch from 128 on the fake card: ((batch, accum, lr), log lines, monitor)."""
    gpu.install(monkeypatch)
    return ProbeBench(m, gpu).run()


def test_item5_the_probe_times_the_gpu_step_not_the_loader(project_modules, digits_dir, tmp_path, monkeypatch, capsys):
    """probe.autoscale on the image project's real Competition, real loader and real timm model;
    the fake card charges each new loader's start and augmentation (0.5 s + 10 ms an image) and
    each step's GPU time (50 ms + batch / 100 images/s) to one clock. GPU samples/s: 8: 62,
    16: 76, 32: 86, 64: 93, 128: 96 (+3.7%: saturated) -> 64. Timing the loader with each step
    (the old probe) gives 11, 18, 27, 35, 41 (+18%): it would grow to 128 and past."""
    m = project_modules
    gpu = FakeGpu(0.002, total_gb=16.0, spike_gb=0.1, overhead_s=0.05, peak_rate=100.0, loader_s=0.5,
                  loader_per_sample_s=0.01).install(monkeypatch)  # fmt: skip
    args = m.train.get_args(["--data-dir", str(digits_dir), "--out-dir", str(tmp_path), "--no-pretrained"])
    args.signature = m.artifacts.run_signature(args)  # what runflags.begin sets before the data is read
    machine = m.engine.make_machine(torch.device("cpu"), "off", m.hardware.loader_settings(1, False), False)
    machine = dataclasses.replace(machine, monitor=m.gpu.GpuMonitor(torch.device("cuda")))
    comp = m.train.Competition(args, machine)
    comp.loader = gpu.loader(comp.loader)
    fold = comp.fold(0, np.arange(200), np.arange(200, 240))
    model = comp.build_model(fold)
    model.register_forward_hook(lambda mod, inp, out: gpu.forward(inp[0].shape[0], mod.training))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batching = m.engine.Batching(8, 4, 1e-3)
    capsys.readouterr()
    m.probe.autoscale(comp, fold, 200 * 30, model, opt, machine, batching, 1e-3, clock=gpu.clock)
    lines = capsys.readouterr().out.splitlines()
    rates = {int(b): float(r) for b, r in re.findall(r"^PROBE: batch=(\d+) -> (\d+) samples/s", "\n".join(lines), re.M)}
    assert rates == {8: 62, 16: 76, 32: 86, 64: 93, 128: 96}, lines  # the GPU's curve, not the loader's
    assert (batching.size, batching.accum_steps) == (64, 1), lines
    # one batch fetched per candidate (train), then one for the eval batch's forward
    assert gpu.fetched == [8, 16, 32, 64, 128, 128], gpu.fetched


def test_item6_the_probe_reads_the_steady_need_with_the_warm_ups_workspace_returned(project_modules, monkeypatch):
    """At 512 the warm-up's 3 GB cuDNN workspace is live beside 17.9 GB of activations, then freed
    but cached: reset_peak_memory_stats resets the peak to that reserved 21.2 GB (+0.6 context =
    91%, 'over the 90% ceiling'). With empty_cache() after the warm-up the timed steps read the
    steady 18.2 GB + context + the handles."""
    m = project_modules
    gpu = FakeGpu(0.035, spike_gb=3.0, handles_gb=0.8)
    (batch, accum, _, _), lines, monitor = _probe(m, gpu, monkeypatch)
    line = next(x for x in lines if x.startswith("PROBE: batch=512 ->"))
    used = float(re.search(r"([\d.]+) GB \(", line).group(1))
    assert used == pytest.approx(gpu.use(512) + 0.8, abs=0.01), line  # steady need + context + handles
    assert "over the 90% ceiling" not in line and (batch, accum) == (512, 1), lines
    assert monitor.outside == int(0.6 * GB) + int(0.8 * GB)  # re-read after the first step: the handles count


def test_item6_the_snapshot_of_the_probed_model_is_a_host_copy(project_modules):
    m = project_modules
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    saved = m.probe.snapshot(model, opt, m.gpu.Amp("off", torch.device("cpu")))
    tensors = [*saved[0].values(), *(v for s in saved[1]["state"].values() for v in s.values())]
    assert tensors and all(t.device.type == "cpu" for t in tensors)
    assert all(
        t.data_ptr() != p.data_ptr() for t, p in zip(saved[0].values(), model.state_dict().values(), strict=True)
    )


def test_item7_a_batch_under_8_is_accepted_with_a_warning(project_modules, monkeypatch):
    """4 GB an image on a 24 GB card: 8 does not fit, 4 does. The old floor raised 'not even a batch
    of 8 fits' and the run ended; now 4 x 32 keeps the effective batch 128."""
    m = project_modules
    gpu = FakeGpu(4.0, spike_gb=2.0)
    (batch, accum, lr, _), lines, _ = _probe(m, gpu, monkeypatch)
    assert (batch, accum) == (4, 32), lines
    assert "PROBE: batch=8 -> out of memory" in lines
    warning = next(x for x in lines if x.startswith("WARNING: only a batch of 4 fits"))
    assert "--grad-checkpointing" in warning and "--image-size" in warning and "--max-len" in warning


def test_item7_nothing_fits_is_one_error_naming_the_way_out(project_modules, monkeypatch):
    m = project_modules
    with pytest.raises(m.errors.RunError, match="not even a batch of 1 fits.*--grad-checkpointing"):
        _probe(m, FakeGpu(30.0), monkeypatch)


def test_eval_batch_is_sized_on_its_own(project_modules, monkeypatch):
    """A forward at 2x the training batch that does not fit halves the *validation* batch only."""
    m = project_modules
    gpu = FakeGpu(0.06, total_gb=16.0, spike_gb=0.0).install(monkeypatch)
    monitor = m.gpu.GpuMonitor(torch.device("cuda"))
    lines = []

    def forward(b):  # a no-grad forward holds a third of a training step's activations here
        gpu.forward(b, train=False)

    size = m.probe.probe_eval_batch(lambda b: b, forward, 512, monitor, log=lines.append)
    assert size == 512 and lines == [
        "EVAL BATCH: 512 (2x the training batch 512, halved until a forward pass fits under 90%)"
    ]


# ----------------------------------------------------------------------------- item 8


@pytest.mark.parametrize(
    "capability,archs,runs",
    [
        ((6, 0), CU130_ARCHS, False),  # Kaggle's P100 on a CUDA 13 wheel
        ((7, 0), CU130_ARCHS, False),  # V100: dropped from CUDA 13 builds too
        ((7, 5), CU130_ARCHS, True),
        ((8, 9), CU130_ARCHS, True),  # L4: sm_86 code runs on sm_89
        ((12, 1), CU130_ARCHS, True),
        ((9, 0), ["sm_80", "sm_86"], False),  # no sm_9x cubin and no PTX
        ((9, 0), ["sm_80", "compute_80"], True),  # PTX: the driver compiles it
        ((10, 0), ["sm_90a", "sm_100f"], True),
    ],
)
def test_item8_kernel_targets_against_the_cards_capability(project_modules, capability, archs, runs):
    assert project_modules.gpu.runs_on(archs, capability) is runs


def test_item8_a_card_this_torch_cannot_run_is_one_error_before_anything_is_written(
    project_modules, digits_dir, tmp_path, monkeypatch
):
    m = project_modules
    FakeCuda("p100", arch_list=CU130_ARCHS).install(monkeypatch)
    out = tmp_path / "out"
    message = r"GPU Tesla P100-PCIE-16GB \(compute capability 6\.0, sm_60\) cannot run this torch .*--device cpu"
    with pytest.raises(m.errors.RunError, match=message):
        m.train.main(["--data-dir", str(digits_dir), "--out-dir", str(out), "--device", "cuda", "--no-pretrained"])
    with pytest.raises(m.errors.RunError, match=message):
        m.train.main(["--data-dir", str(digits_dir), "--out-dir", str(out), "--no-pretrained"])  # --device auto
    assert not out.exists()
    with pytest.raises(m.errors.RunError, match=message):
        m.predict.main(["--data-dir", str(digits_dir), "--out-dir", str(out), "--device", "cuda"])
    assert not out.exists()
    FakeCuda("t4", arch_list=CU130_ARCHS).install(monkeypatch)
    assert m.gpu.resolve_device("cuda") == torch.device("cuda")


# ----------------------------------------------------------------------------- item 9: DDP


def _torchrun_oom(tmp_path, project, agree: str, timeout_s: int = 20):
    """tests/ddp_oom.py under torchrun: two gloo ranks, rank 1 alone out of memory. `timeout_s`: the
    process group's, its start (both ranks' imports) included."""
    env = {**RUN_ENV, "AGREE": agree, "PYTHONPATH": str(project), "TIMEOUT_S": str(timeout_s)}
    script = Path(__file__).with_name("ddp_oom.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path)


@pytest.fixture(scope="module")
def image_project(tmp_path_factory, digits_dir):
    return render(tmp_path_factory.mktemp("ddp-oom") / "proj", data_dir=str(digits_dir))


@pytest.mark.slow
def test_item9_ddp_an_oom_on_one_rank_is_agreed_and_every_rank_splits_alike(tmp_path, image_project):
    r = _torchrun_oom(tmp_path, image_project, "1")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ranks = sorted(re.findall(r"RANK \d: parts=\d+ calls=\[[\d, ]*\] same_as_one_process=(?:True|False)", r.stdout))
    # rank 0 never ran out of memory, yet splits its batches exactly as rank 1 does (batch 2 was
    # tried whole, then both ranks redo it and batch 3 as 2 x 4), and both equal one process
    assert ranks == [
        "RANK 0: parts=2 calls=[8, 8, 4, 4, 4, 4] same_as_one_process=True",
        "RANK 1: parts=2 calls=[8, 8, 4, 4, 4, 4] same_as_one_process=True",
    ], r.stdout
    assert "every DDP rank splits alike" in r.stdout
    assert sorted(re.findall(r"RANK \d gloo threads after finish_ddp: .*", r.stdout)) == [
        f"RANK {k} gloo threads after finish_ddp: []" for k in (0, 1)
    ], r.stdout


@pytest.mark.slow
def test_item9_without_the_agreement_ddps_collectives_no_longer_match(tmp_path, image_project):
    """The old loop (DDP's own all-reduce inside backward): rank 1 alone splits, its extra backward
    passes meet rank 0's next all-reduce; the ranks' collectives no longer line up and both hang
    until the process group's timeout (NCCL on a card: its watchdog, 10 minutes by default)."""
    # 10 s, not 20: the test waits all of it (26.7 s with 20, 13.9 s with 8, alone on 2 cores)
    r = _torchrun_oom(tmp_path, image_project, "0", timeout_s=10)
    assert r.returncode != 0, r.stdout[-3000:]
    # measured here: both ranks wait in mismatched gloo collectives (a send, a recv) until the timeout
    collective = r"Timed out waiting \d+ms for (send|recv) operation|Expected to have finished reduction|mismatch"
    assert re.search(collective, r.stderr), r.stderr[-3000:]


# ----------------------------------------------------------------------------- item 10


@in_a_process
def test_item10_a_torch_without_torch_outofmemoryerror_still_recovers(project_modules):
    """torch.OutOfMemoryError is new in 2.5; on 2.3 (which pyproject allows) the first real OOM
    raised AttributeError inside the except clause."""
    project = Path(project_modules.gpu.__file__).parents[1]
    r = in_project(
        project,
        """
        import torch
        del torch.OutOfMemoryError  # torch < 2.5
        from machinery import engine, gpu, steps
        x, y = torch.randn(24, 8), torch.randint(0, 3, (24,))
        model = torch.nn.Linear(8, 3)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
        calls = []
        def batch_loss(batch):
            calls.append(len(batch[0]))
            if len(batch[0]) > 4 and len(calls) > 1:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory")
            return torch.nn.functional.cross_entropy(model(batch[0]), batch[1]), len(batch[0])
        batching = engine.Batching(8, 1, 0.1)
        batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 24, 8)]
        steps.run_epoch(batches, 3, batch_loss, opt, sched, gpu.Amp("off", torch.device("cpu")), batching)
        print("PARTS:", batching.parts, gpu.OutOfMemoryError is torch.cuda.OutOfMemoryError)
        """,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "PARTS: 2 True" in r.stdout


# ----------------------------------------------------------------------------- the lesser list


def test_the_detected_card_wins_over_the_rendered_profile(project_modules, monkeypatch, capsys):
    m = project_modules
    FakeCuda("t4").install(monkeypatch)
    found = m.engine.profile("a100-40", torch.device("cuda"))
    assert found.name == "t4"
    assert capsys.readouterr().out.startswith(
        "WARNING: --gpu a100-40 (NVIDIA A100 40GB, 40 GB) but this card is Tesla T4"
    )
    assert m.engine.profile("t4", torch.device("cuda")).name == "t4" and capsys.readouterr().out == ""
    rec = m.hardware.recommend(found, "resnet50", 224)
    assert rec.batch_size < m.hardware.recommend(m.hardware.PROFILES["a100-40"], "resnet50", 224).batch_size


def test_bf16_on_a_card_without_it_trains_in_fp16_with_a_warning(project_modules, monkeypatch, capsys):
    m = project_modules
    FakeCuda("t4").install(monkeypatch)
    machine = m.engine.make_machine(torch.device("cuda"), "bf16", {}, channels_last=False)
    assert machine.amp.mode == "fp16" and machine.amp.scaler.is_enabled()
    assert "WARNING: --amp bf16 on compute capability 7.5" in capsys.readouterr().out
    FakeCuda("a100").install(monkeypatch)
    assert m.engine.make_machine(torch.device("cuda"), "bf16", {}, channels_last=False).amp.mode == "bf16"


def test_compile_needs_compute_capability_7(project_modules, monkeypatch):
    m = project_modules
    FakeCuda("p100").install(monkeypatch)
    ok, why = m.machine.can_compile(torch.device("cuda"))
    assert not ok and "Triton" in why
    FakeCuda("t4").install(monkeypatch)
    assert m.machine.can_compile(torch.device("cuda"))[0]
    assert m.machine.can_compile(torch.device("cpu"))[0]


def test_image_normalize_builds_its_constants_once_per_device(project_modules):
    train = project_modules.train
    x = torch.randint(0, 255, (2, 3, 4, 4), dtype=torch.uint8)
    a, b = project_modules.images.imagenet_stats(x.device), project_modules.images.imagenet_stats(x.device)
    assert a[0] is b[0] and a[1] is b[1]
    expected = (x.float() - torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255) / (
        torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255
    )
    torch.testing.assert_close(train.normalize(x), expected)


# ----------------------------------------------------------------------------- issue 46: what the first H100 run found


def test_cudnn_autotune_is_off_unless_asked_for(project_modules, monkeypatch, capsys):
    """cudnn.benchmark cost up to a minute a process on the H100 (87 s vs 26 s first epoch) and no
    steady speed: no machine turns it on; --cudnn-benchmark does."""
    m = project_modules
    FakeCuda("h100").install(monkeypatch)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    m.engine.make_machine(torch.device("cuda"), "auto", {}, channels_last=True)
    m.engine.inference_machine(torch.device("cuda"), [("f", {"config": {"amp": "bf16"}})], {}, True)
    assert torch.backends.cudnn.benchmark is False
    args = m.train.get_args(["--no-pretrained"])
    m.runflags.speed_settings(args, torch.device("cuda"))
    assert torch.backends.cudnn.benchmark is False
    m.runflags.speed_settings(m.train.get_args(["--no-pretrained", "--cudnn-benchmark"]), torch.device("cuda"))
    assert torch.backends.cudnn.benchmark is True


@pytest.mark.parametrize(
    "card,flags,expected",
    [
        ("h100", ["--budget", "9h"], "try (auto: ~91.8 min of training a fold"),  # 5 folds: 9h x 0.85 / 5
        ("t4", ["--budget", "9h"], "try (auto: ~91.8 min of training a fold"),  # measured, not assumed (issue 57)
        ("h100", ["--budget", "10m"], "off (auto: 102s of training a fold, under 20x"),
        ("h100", ["--budget", ""], "off (auto: no --budget to amortise it over"),
        ("h100", ["--budget", "9h", "--dry-run"], "off (auto: a dry run or a tune.py trial"),
        ("h100", ["--budget", "9h", "--train-folds", "1"], "off (auto: a dry run or a tune.py trial"),
        ("p100", ["--budget", "9h"], "off (auto: --compile needs compute capability >= 7.0"),
        ("cpu", ["--budget", "9h"], "off (auto: cpu: compiling costs"),
        ("cpu", ["--compile"], "on (--compile on)"),  # the user's word is kept
        ("h100", ["--budget", "9h", "--compile", "off"], "off (--compile off)"),
    ],
)
def test_compile_auto_tries_where_the_plan_amortises_it(project_modules, monkeypatch, capsys, card, flags, expected):
    m = project_modules
    device = torch.device("cpu")
    if card != "cpu":
        FakeCuda(card).install(monkeypatch)
        device = torch.device("cuda")
    args = m.train.get_args(["--no-pretrained", "--folds", "5", *flags])
    capsys.readouterr()
    m.runflags.speed_settings(args, device)
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"COMPILE: {expected}"), line
    assert args.compile == expected.split()[0]


@pytest.mark.slow  # a fresh interpreter imports train.py (7 s)
def test_albumentations_is_imported_offline(project_modules):
    """albumentations asks PyPI for its version at import unless NO_ALBUMENTATIONS_UPDATE is set:
    every run on the H100 printed 'Error fetching version info <urlopen error ...>'. train.py
    sets it before the import (predict.py, tune.py and serve.py import train)."""
    from conftest import ROOT

    project = Path(project_modules.train.__file__).parent
    hook = (
        "import os, sys\n"
        "class Seen:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'albumentations':\n"
        "            print('AT IMPORT:', os.environ.get('NO_ALBUMENTATIONS_UPDATE'))\n"
        "sys.meta_path.insert(0, Seen())\n"
        "import train\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "NO_ALBUMENTATIONS_UPDATE"}
    r = subprocess.run([sys.executable, "-c", hook], cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[0] == "AT IMPORT: 1", r.stdout
    for task in ("segmentation", "detection"):
        source = (ROOT / "template" / f"{{% if task == '{task}' %}}train.py{{% endif %}}.jinja").read_text()
        assert source.index('os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")') < source.index(
            "import albumentations"
        ), task


def _doctor(tmp_path, lines: list[str], pct: float) -> subprocess.CompletedProcess:
    """kagtpl doctor on an 80 GB card's log made of the engine's own lines, at `pct` of memory."""
    text = [
        "RESOURCES: 16 CPU cores, batch=264, GPU=NVIDIA H100 80GB HBM3, Mixed Precision=ON",
        "GPU Memory: 79.1 GB",
        "DataLoader: num_workers=12, prefetch_factor=3, persistent_workers=True",
        "Model: resnet50 (25.6M params, small model)",
        *lines,
        f"Epoch 1: Loss=0.5, ValLoss=0.4, Acc=0.9, LR=1e-3, Time=3.0s, Throughput=3300 samples/s, "
        f"GPU={79.1 * pct / 100:.2f}GB ({pct:.1f}%)",
    ]
    path = tmp_path / "train.log"
    path.write_text("\n".join(text) + "\n")
    return subprocess.run(
        [sys.executable, "-m", "kagtpl", "doctor", str(path)], capture_output=True, text=True, timeout=120
    )


def test_item45_a_small_data_batch_is_kept_by_the_log_and_the_doctor(
    project_modules, digits_dir, tmp_path, monkeypatch, capsys
):
    """The H100's 8,000 images: the small-data floor (30 steps an epoch) capped the batch at 264
    (17% of 80 GB), the probe measured that one batch and called it '100% of the best', then
    VALIDATION said 'TOO SMALL - should be 528+' and the doctor 'ACTION NEEDED ... x16'. Here the
    digits (160 training rows: the cap is 5) on a fake H100 through the real engine: the probe
    says it had one candidate and why, VALIDATION keeps it, and the doctor agrees (exit 0)."""
    m = project_modules
    gpu = FakeGpu(0.01, total_gb=79.1, spike_gb=0.1, card="h100").install(monkeypatch)
    args = m.train.get_args(["--data-dir", str(digits_dir), "--out-dir", str(tmp_path), "--no-pretrained"])
    args.signature = m.artifacts.run_signature(args)
    machine = m.engine.make_machine(torch.device("cpu"), "off", m.hardware.loader_settings(1, False), False)
    machine = dataclasses.replace(machine, monitor=m.gpu.GpuMonitor(torch.device("cuda")))
    comp = m.train.Competition(args, machine)
    fold = comp.fold(0, np.arange(160), np.arange(160, 240))
    model = comp.build_model(fold)
    model.register_forward_hook(lambda mod, inp, out: gpu.forward(inp[0].shape[0], mod.training))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batching = m.engine.Batching(64, 1, 1e-3)
    m.engine.fit_steps(batching, 160 * 30 // 8, 1e-3)  # 600 rows: 64 -> 16, small data
    assert batching.why[0] == "small-data" and batching.size < 64
    capsys.readouterr()
    m.probe.autoscale(comp, fold, batching.size * 30, model, opt, machine, batching, 1e-3, clock=gpu.clock)
    m.fold.first_step_lines(machine, batching)
    lines = capsys.readouterr().out.splitlines()
    probe = next(x for x in lines if x.startswith("BATCH PROBE: batch "))
    assert "the only candidate, nothing to choose from: " in probe and "optimizer steps an epoch" in probe, probe
    assert "100% of the best" not in probe
    validation = next(x for x in lines if x.startswith("VALIDATION: "))
    assert re.match(rf"VALIDATION: batch_size={batching.size}, [\d.]+% of GPU memory, set by small-data \(", validation)
    assert validation.endswith("keep it: a bigger batch leaves fewer optimizer steps an epoch, and trains worse")
    assert "TOO SMALL" not in validation
    r = _doctor(tmp_path, lines, 17.0)
    assert r.returncode == 0, r.stdout
    assert f"DECISION: < 50%: keep batch {batching.size}: set by small-data (" in r.stdout, r.stdout
    assert "STATUS: OK" in r.stdout and "grow" not in r.stdout


def test_item4_after_an_oom_the_batch_is_kept_by_the_log_and_the_doctor(project_modules, tmp_path, monkeypatch):
    """PROBE: batch=8 -> out of memory, then the VALIDATION line said 'should be 8+' of the 4 that
    fits: now it says the OOM set it, and the doctor keeps it."""
    m = project_modules
    (batch, accum, _, why), lines, _ = ProbeBench(m, FakeGpu(4.0, spike_gb=2.0).install(monkeypatch)).run()
    assert (batch, why) == (4, ("oom", "batch 8 ran out of memory in the probe")), lines
    line = m.logs.validation_line(batch, 20.0, why)
    assert line == (
        "VALIDATION: batch_size=4, 20.0% of GPU memory, set by oom (batch 8 ran out of memory in the probe): "
        "keep it: a bigger batch does not fit"
    )
    r = _doctor(tmp_path, [*lines, line], 20.0)
    assert r.returncode == 0 and "DECISION: < 50%: keep batch 4: set by oom (" in r.stdout, r.stdout
    # an OOM mid-run halves the micro-batch: the doctor reads that too, not only the first VALIDATION
    rule = m.logs.validation_line(128, 20.0, ("rule", "the GPU profile's rule"))
    r = _doctor(
        tmp_path,
        [rule, "OOM: batch of 128 did not fit at step 40: micro-batch 128 -> 64, accumulation 1 -> 2, effective batch"],
        20.0,
    )
    assert r.returncode == 0 and "keep batch 64: set by oom" in r.stdout, r.stdout


@in_a_process
def test_item4_a_small_tables_batch_is_kept_by_the_log_and_the_doctor(price_table, tmp_path):
    """The second H100 run: a 456-row table's MLP took batch 32 (4096 cut to a power of two that
    leaves an epoch 8 steps), and VALIDATION said 'set by user (--batch-size 0 / --accum-steps 1):
    ... TOO SMALL - should be 64+': --accum-steps defaulted to 1, which read as your flag. Now the
    cut is the engine's (small-data, kept); a big table keeps the rule's 4096, and your flag is yours."""
    r = in_project(
        price_table,
        """
        from machinery import hardware, logs, machine
        from train import batching_for, get_args
        h100 = hardware.PROFILES["h100"]
        for flags, rows in (([], 456), ([], 10**6), (["--batch-size", "64"], 456)):
            args = get_args(flags)
            b = batching_for(args, h100, rows)
            print("CASE:", rows, b.size, b.accum_steps, machine.batch_set_by_user(args), b.why[0])
            print(logs.validation_line(b.size, 1.0, b.why))
        """,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    cases = [x for x in r.stdout.splitlines() if x.startswith("CASE:")]
    assert cases == ["CASE: 456 32 1 False small-data", "CASE: 1000000 4096 1 False rule", "CASE: 456 64 1 True rule"]
    small = next(x for x in r.stdout.splitlines() if x.startswith("VALIDATION: batch_size=32,"))
    assert "set by small-data (GPU: 4096, capped at the power of two <= 456 rows / 8 steps -> 32): keep it" in small
    d = _doctor(tmp_path, [small], 1.0)
    assert d.returncode == 0 and "DECISION: < 50%: keep batch 32: set by small-data (" in d.stdout, d.stdout


@pytest.mark.parametrize("key", ["rule", "user"])
def test_item4_a_batch_from_the_rule_or_your_flag_under_half_the_memory_is_still_too_small(
    project_modules, tmp_path, key
):
    line = project_modules.logs.validation_line(128, 20.0, (key, "why"))
    assert line.endswith("If <50% memory, batch_size=128 is TOO SMALL - should be 256+"), line
    r = _doctor(tmp_path, [line], 20.0)
    assert r.returncode == 1 and "DECISION: < 50%: double the batch: batch 128 -> 256" in r.stdout, r.stdout
