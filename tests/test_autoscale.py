"""Batch autoscale and OOM recovery, on CPU, through one seam: a fake peak-memory reader and a
fake OOM above a batch size. Everything behind the seam (probing, restore, accumulation, LR
rule, micro-batching) is the generated project's real code."""

from __future__ import annotations

import numpy as np
import pytest
import torch

GB = 1024**3


class FakeGpu:
    """Peak memory grows linearly with the batch; a batch above `oom_above` raises OOM."""

    def __init__(self, gb_per_sample, total_gb=24.0, base_gb=1.0, oom_above=10**9):
        self.gb_per_sample, self.total, self.base, self.oom_above = gb_per_sample, total_gb, base_gb, oom_above
        self.last, self.steps = 0, []

    def step(self, batch_fn):
        def step(b):
            self.steps.append(b)
            if b > self.oom_above:
                raise torch.OutOfMemoryError("fake: CUDA out of memory")
            self.last = b
            batch_fn(b)

        return step

    def reader(self):
        return int((self.base + self.gb_per_sample * self.last) * GB), int(self.total * GB)


def setup(project_modules, gpu):
    kit = project_modules.gpu
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    amp = kit.Amp("off", torch.device("cpu"))
    monitor = kit.GpuMonitor(torch.device("cpu"), reader=gpu.reader, reset=lambda: None)

    def real_step(b):
        x, y = torch.randn(b, 8), torch.randint(0, 3, (b,))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return kit, model, opt, amp, monitor, gpu.step(real_step)


@pytest.mark.parametrize(
    "size_class,gb_per_sample,oom_above,expected,accum,lr",
    [
        # large model, 24 GB: 128 -> 7.0 GB (29%) -> 256 (55%) -> 512 (105%, over) -> 384 (80%): in band
        ("large", 0.045, 10**9, 384, 1, 1e-3 * (384 / 128) ** 0.5),
        # small model: target 50%: 128 (29%) -> 256 (55%) stops there
        ("small", 0.045, 10**9, 256, 1, 1e-3 * 2**0.5),
        # an OOM at 512 and 384: steps back, keeps 256 (55%), below target but the largest that fits
        ("large", 0.045, 300, 256, 1, 1e-3 * 2**0.5),
        # the default does not fit: 64 (62%), 96 fits, 128 OOMs: 64 x 2 keeps the effective batch 128
        ("large", 0.2, 100, 64, 2, 1e-3),
        # T4 default 64 x 2: grows to 256 (>= the effective 128): accumulation 1, lr x sqrt(2)
        ("large", 0.06, 10**9, 256, 1, 1e-3 * 2**0.5),
    ],
)
def test_probe_picks_the_batch_in_the_band(project_modules, size_class, gb_per_sample, oom_above, expected, accum, lr):
    gpu = FakeGpu(gb_per_sample, oom_above=oom_above)
    kit, model, opt, amp, monitor, step = setup(project_modules, gpu)
    lines = []
    start, start_accum = (64, 2) if gb_per_sample == 0.06 else (128, 1)
    batch, new_accum, new_lr = kit.probe_batch(
        step, model, opt, amp, start, start_accum, size_class, monitor, 4096, 1e-3, log=lines.append
    )
    assert (batch, new_accum) == (expected, accum), lines
    assert new_lr == pytest.approx(lr)
    assert lines[0].startswith(f"BATCH PROBE: {size_class} model, target >=")
    assert any("in band" in x or "below target" in x for x in lines[1:-1])
    assert lines[-1].startswith(f"BATCH PROBE: batch {start} x {start_accum} -> {expected} x {accum} (")


def test_probing_does_not_train_the_model(project_modules):
    gpu = FakeGpu(0.045)
    kit, model, opt, amp, monitor, step = setup(project_modules, gpu)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt_before = opt.state_dict()
    kit.probe_batch(step, model, opt, amp, 128, 1, "large", monitor, 4096, 1e-3, log=lambda _: None)
    assert len(gpu.steps) >= 3  # real optimizer steps were taken while probing...
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k  # ...and undone: weights and BatchNorm statistics
    assert opt.state_dict()["state"] == opt_before["state"] == {}


def test_oom_mid_epoch_halves_the_micro_batch_and_keeps_the_effective_batch(project_modules, capsys):
    m = project_modules
    torch.manual_seed(0)
    x, y = torch.randn(24, 8), torch.randint(0, 3, (24,))
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 24, 8)]
    model, ref = torch.nn.Linear(8, 3), torch.nn.Linear(8, 3)
    ref.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    seen_sizes = []

    def batch_loss(batch):  # a fake OOM at batch > 4, from the second batch on (memory got tight)
        xb, yb = batch
        seen_sizes.append(len(xb))
        if len(xb) > 4 and len(seen_sizes) > 1:
            raise torch.OutOfMemoryError("fake: CUDA out of memory")
        return torch.nn.functional.cross_entropy(model(xb), yb), len(xb)

    batching = m.engine.Batching(8, 1, 0.5)
    loss, seen = m.engine.run_epoch(batches, 3, batch_loss, opt, sched, m.gpu.Amp("off", torch.device("cpu")), batching)
    assert seen == 24 and batching.parts == 2 and sched.last_epoch == 3  # every batch still stepped
    assert seen_sizes == [8, 8, 4, 4, 4, 4]
    out = capsys.readouterr().out
    assert (
        "OOM: batch of 8 did not fit at step 1: micro-batch 8 -> 4, accumulation 1 -> 2, effective batch 8 unchanged"
        in out
    )
    # the same three steps with whole batches: identical weights (effective batch unchanged)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    for xb, yb in batches:
        ref_opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(xb), yb).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q)


def test_memory_drop_line(project_modules):
    kit = project_modules.logs
    assert kit.memory_drop_line((18.3, 24.0, 76.3), (10.8, 24.0, 45.0)).startswith(
        "WARNING: GPU memory fell from 76.3% to 45.0% between epochs"
    )
    assert kit.memory_drop_line((18.3, 24.0, 76.3), (17.9, 24.0, 74.6)) is None
    assert kit.memory_drop_line(None, (1.0, 24.0, 4.0)) is None


def test_engine_autoscale_updates_batch_accumulation_and_lr(project_modules, digits_dir, tmp_path):
    """The engine's probe hook on the generated train.py's real Competition: real steps of a real
    timm model on CPU through its own loader and loss, memory from the fake reader; the run's one
    Batching (batch, accumulation, LR) and the optimizer follow the probe."""
    import dataclasses

    m = project_modules
    args = m.train.get_args(["--data-dir", str(digits_dir), "--out-dir", str(tmp_path), "--no-pretrained"])
    device = torch.device("cpu")
    machine = m.engine.make_machine(device, "off", m.hardware.loader_settings(1, False), channels_last=False)
    comp = m.train.Competition(args, machine)
    fold = comp.fold(0, np.arange(64), np.arange(64, 80))
    model = comp.build_model(fold)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gpu, sizes = FakeGpu(0.1, total_gb=24.0), []

    def seen(module, inputs, output):  # the fake memory follows the batch the real step ran
        gpu.last = inputs[0].shape[0]
        sizes.append(gpu.last)

    model.register_forward_hook(seen)
    fake = m.gpu.GpuMonitor(device, reader=gpu.reader, reset=lambda: None)
    batching = m.engine.Batching(8, 4, 1e-3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    m.engine.autoscale(comp, fold, 64, model, opt, dataclasses.replace(machine, monitor=fake), batching)
    # resnet18 is small (target 50%): 8 -> 1.8 GB (7.5%), x2 -> 16 = max_batch (64 rows // 4)
    assert sizes == [8, 16]
    assert (batching.size, batching.accum_steps, batching.lr) == (16, 2, 1e-3)  # effective batch 32 kept
    assert opt.param_groups[0]["lr"] == 1e-3
    config = m.engine.checkpoint_config(args, machine, batching)
    assert (config["batch_size"], config["accum_steps"], config["lr"]) == (16, 2, 1e-3)  # derived when saved
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k  # probing trained nothing


# ----------------------------------------------------------------------------- OOM anywhere in a step


def _batches(n=3, rows=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n * rows, 8, generator=g), torch.randint(0, 3, (n * rows,), generator=g)
    return [(x[i : i + rows], y[i : i + rows]) for i in range(0, n * rows, rows)]


def _train(m, amp_mode, batches, step_ooms=0, backward_error=None, forget=True):
    """Three steps of SGD through the engine's run_epoch, with a real GradScaler when amp_mode is
    fp16; `step_ooms` optimizer steps raise OOM first (after the scaler has unscaled the grads),
    `backward_error` is raised once from inside backward for batches above 4 rows."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    amp = m.gpu.Amp(amp_mode, torch.device("cpu"))
    if not forget:
        amp.forget_step = lambda optimizer: None  # the bug: the scaler keeps its stale "unscaled" stage
    real_step, left = opt.step, {"step": step_ooms, "backward": 1 if backward_error else 0}

    def step(*args, **kwargs):
        if left["step"]:
            left["step"] -= 1
            raise torch.OutOfMemoryError("fake: CUDA out of memory in optimizer.step")
        return real_step(*args, **kwargs)

    if step_ooms:
        opt.step = step

    class Fails(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            if left["backward"] and grad.shape[0] > 4:
                left["backward"] -= 1
                raise backward_error
            return grad

    def batch_loss(batch):
        xb, yb = batch
        return torch.nn.functional.cross_entropy(Fails.apply(model(xb)).float(), yb), len(yb)

    batching = m.engine.Batching(8, 1, 0.5)
    m.engine.run_epoch(batches, len(batches), batch_loss, opt, sched, amp, batching)
    return model, batching, amp


@pytest.mark.filterwarnings("ignore:Seems like .optimizer.step.. has been overridden")
@pytest.mark.parametrize("amp_mode", ["fp16", "bf16", "off"])
def test_oom_in_optimizer_step_redoes_the_group_with_a_real_grad_scaler(project_modules, amp_mode, capsys):
    m, batches = project_modules, _batches()
    ref, _, _ = _train(m, amp_mode, batches)
    model, batching, amp = _train(m, amp_mode, batches, step_ooms=1)
    assert batching.parts == 2 and "OOM: batch of 8 did not fit at step 0" in capsys.readouterr().out
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=2e-2, atol=2e-3)  # the same 3 steps, as 2 micro-batches each
    if amp_mode == "fp16":
        assert amp.scaler.is_enabled() and amp.scaler.get_scale() == 65536.0  # a real scaler, no inf seen


@pytest.mark.filterwarnings("ignore:Seems like .optimizer.step.. has been overridden")
def test_the_stale_scaler_bug_is_what_forget_step_prevents(project_modules):
    """Without dropping the scaler's stage after an OOM in step(), the redone gradients are applied
    still scaled (65536x): the test above would fail."""
    m, batches = project_modules, _batches()
    ref, _, _ = _train(m, "fp16", batches)
    stale, _, _ = _train(m, "fp16", batches, step_ooms=1, forget=False)
    assert (stale.weight - ref.weight).abs().max() > 100 * (ref.weight.abs().max())


def test_cudnn_allocation_failure_in_backward_counts_as_oom(project_modules, capsys):
    m, batches = project_modules, _batches()
    ref, _, _ = _train(m, "off", batches)
    error = RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED")
    model, batching, _ = _train(m, "off", batches, backward_error=error)
    assert batching.parts == 2 and "OOM: batch of 8" in capsys.readouterr().out
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q)
    with pytest.raises(RuntimeError, match="device-side assert"):  # any other error is not an OOM
        _train(m, "off", batches, backward_error=RuntimeError("CUDA error: device-side assert triggered"))


def test_prediction_halves_a_batch_that_runs_out_of_memory(project_modules):
    m = project_modules
    machine = m.engine.make_machine(torch.device("cpu"), "off", {}, channels_last=False)
    model = torch.nn.Linear(8, 3)
    batches = _batches(n=2, rows=8)
    tried = []

    def predict_fn(model, batch):
        tried.append(len(batch[0]))
        if len(batch[0]) > 3:
            raise torch.OutOfMemoryError("fake: CUDA out of memory in validation")
        return model(batch[0]).softmax(1)

    out = m.engine.predict(predict_fn, model, batches, machine)
    expected = torch.cat([model(x).softmax(1) for x, _ in batches]).detach().numpy()
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    assert tried == [8, 4, 2, 2, 2, 2, 2, 2, 2, 2]  # halved until it fits, then kept at that size
