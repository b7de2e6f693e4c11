"""The batch probe and OOM recovery, on CPU, through one seam (tests/fake_gpu.py): strict fakes of
the torch.cuda functions the project calls, over a model of the caching allocator (the context's
memory, reserved vs allocated memory, a cuDNN workspace beside the activations the first time a
shape runs, cached until empty_cache, the optimizer state from the first step on, OOM past the
card), and a fake clock with a saturating throughput curve. Everything behind the seam (probing,
restore, accumulation, LR rule, micro-batching) is the generated project's real code."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from fake_gpu import GB, FakeGpu, ProbeBench


def probe(project_modules, gpu, monkeypatch, start=128, accum=1, max_batch=4096, amp_mode="off", size_class="small"):
    """probe.probe_batch on a small real model on CPU; the monitor is the project's own GpuMonitor on
    "cuda", reading the fake card through torch.cuda's (strict, faked) functions."""
    gpu.install(monkeypatch)
    result, lines, _ = ProbeBench(project_modules, gpu, amp_mode).run(start, accum, max_batch, size_class)
    return result, lines


@pytest.mark.parametrize(
    "gb_per_sample,start,accum,max_batch,expected,why",
    [
        # memory to spare: 128 -> 2048 runs 1123, 1438, 1673, 1822, 1907 samples/s; 2048 gains < 5%
        # over 1024, and 1024 is within 5% of the best: 1024 (a memory-filling probe would take ~3000)
        (0.005, 128, 1, 4096, (1024, 1), "saturated"),
        # memory-bound: 512 does not fit (26 GB): 256 (1438/s, 55%) beats 128 (1123/s) by > 5%
        (0.045, 128, 1, 4096, (256, 1), "oom"),
        # the default does not fit (128: 29 GB): 64 does (15 GB); 64 x 2 keeps the effective batch 128
        (0.2, 128, 1, 4096, (64, 2), "halved"),
        # small data: at most len(train) / 30 rows a batch: the probe stops at max_batch
        (0.005, 128, 1, 256, (256, 1), "max_batch"),
        # T4 default 64 x 2 grows past the effective 128: accumulation 1, LR x sqrt(new / old)
        (0.045, 64, 2, 4096, (256, 1), "oom"),
    ],
)
def test_probe_keeps_the_smallest_batch_within_5_percent_of_the_best_speed(
    project_modules, monkeypatch, gb_per_sample, start, accum, max_batch, expected, why
):
    gpu = FakeGpu(gb_per_sample)
    (batch, new_accum, lr, set_by), lines = probe(project_modules, gpu, monkeypatch, start, accum, max_batch)
    assert (batch, new_accum) == expected, lines
    # why the batch is what it is (the VALIDATION line's key): the fastest, the OOM above it, the cap
    assert set_by[0] == {"saturated": "probe", "oom": "oom", "halved": "oom", "max_batch": "probe"}[why], set_by
    assert ("cap of 256" in set_by[1]) == (why == "max_batch"), set_by
    assert all(b % 8 == 0 for b in set(gpu.steps)), gpu.steps  # every candidate a multiple of 8
    # the one LR rule: --lr (1e-3) up to an effective batch of 128, x sqrt(effective / 128) above
    assert lr == pytest.approx(1e-3 * max(1.0, batch * new_accum / 128) ** 0.5)
    assert lines[0].startswith("BATCH PROBE: small model, fastest batch within 5% of the best samples/s")
    rates = {int(b): float(r) for b, r in re.findall(r"^PROBE: batch=(\d+) -> (\d+) samples/s", "\n".join(lines), re.M)}
    chosen = batch if new_accum == 1 else next(b for b in rates if b >= batch)
    assert rates[chosen] >= 0.95 * max(rates.values())  # within 5% of the best measured
    assert all(b >= chosen or rates[b] < 0.95 * max(rates.values()) for b in rates)  # and the smallest such
    if why == "oom":
        assert any(x.endswith("-> out of memory") for x in lines)
    assert re.match(rf"BATCH PROBE: batch {start} x {accum} -> {batch} x {new_accum} \(", lines[-1]), lines[-1]


def test_probing_does_not_train_the_model_and_leaves_a_fresh_fp16_scaler(project_modules, monkeypatch):
    gpu = FakeGpu(0.045).install(monkeypatch)
    bench = ProbeBench(project_modules, gpu, amp_mode="fp16")
    model, opt, amp = bench.model, bench.opt, bench.amp
    before = {k: v.clone() for k, v in model.state_dict().items()}
    scale = amp.scaler.get_scale()
    bench.run(128, 1, 4096, "large")
    assert len(gpu.steps) >= 8  # real optimizer steps were taken while probing (a real GradScaler)...
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k  # ...and undone: weights and BatchNorm statistics
    assert opt.state_dict()["state"] == {}
    assert amp.scaler.get_scale() == scale and not amp.scaler._per_optimizer_states  # fresh for training


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
    loss, seen = m.steps.run_epoch(batches, 3, batch_loss, opt, sched, m.gpu.Amp("off", torch.device("cpu")), batching)
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


def test_engine_autoscale_updates_batch_accumulation_and_lr(project_modules, digits_dir, tmp_path, capsys):
    """The engine's probe hook on the generated train.py's real Competition: real steps of a real
    timm model on CPU through its own loader and loss, memory from the fake reader; the run's one
    Batching (batch, accumulation, LR) and the optimizer follow the probe."""
    import dataclasses

    m = project_modules
    args = m.train.get_args(["--data-dir", str(digits_dir), "--out-dir", str(tmp_path), "--no-pretrained"])
    args.signature = m.artifacts.run_signature(args)  # what runflags.begin sets before the data is read
    device = torch.device("cpu")
    machine = m.engine.make_machine(device, "off", m.hardware.loader_settings(1, False), channels_last=False)
    comp = m.train.Competition(args, machine)
    fold = comp.fold(0, np.arange(64), np.arange(64, 80))
    model = comp.build_model(fold)
    opt = m.steps.make_optimizer(comp, model, 1e-3, 0.05)  # the fold's AdamW (fused), as fold.build makes it
    sizes, eval_sizes, peak = [], [], {"gb": 0.0}

    def seen(module, inputs, output):  # the fake memory follows the batch the real step ran
        (sizes if module.training else eval_sizes).append(inputs[0].shape[0])
        peak["gb"] = max(peak["gb"], 1.0 + 0.1 * inputs[0].shape[0])

    model.register_forward_hook(seen)
    fake = m.gpu.GpuMonitor(device, reader=lambda: (int(peak["gb"] * GB), 24 * GB), reset=lambda: peak.update(gb=0))
    batching = m.engine.Batching(8, 4, 1e-3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    capsys.readouterr()
    m.probe.autoscale(comp, fold, 64 * 30, model, opt, dataclasses.replace(machine, monitor=fake), batching, 1e-3)
    lines = capsys.readouterr().out.splitlines()
    # the real loader's batches: 8, then doublings, each one warm-up + 3 timed steps, never past 64
    # (len(train) / 30 = 64: enough optimizer steps an epoch)
    probed = sizes[::4]
    assert sizes == [b for b in probed for _ in range(4)] and probed == [8 * 2**k for k in range(len(probed))]
    assert max(probed) <= 64
    final = re.match(r"BATCH PROBE: batch 8 x 4 -> (\d+) x (\d+) ", lines[-2])
    # the validation batch, sized on its own: one no-grad forward of a *validation* batch at 2x the
    # training batch (it fits); the fold's validation holds 16 rows, so the forward saw at most 16
    assert eval_sizes == [min(16, 2 * batching.size)] and batching.eval_size == 2 * batching.size
    eval_line = f"EVAL BATCH: {2 * batching.size} (2x the training batch {batching.size}, halved until"
    assert lines[-1].startswith(eval_line)
    assert final, lines
    assert (batching.size, batching.accum_steps) == (int(final.group(1)), int(final.group(2)))
    assert batching.effective >= 32 and opt.param_groups[0]["lr"] == batching.lr
    assert batching.lr == m.hardware.scaled_lr(1e-3, batching.effective)  # the one LR rule, from --lr
    config = m.artifacts.checkpoint_config(args, machine, batching)
    assert (config["batch_size"], config["accum_steps"], config["lr"]) == (
        batching.size,
        batching.accum_steps,
        batching.lr,
    )
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
    m.steps.run_epoch(batches, len(batches), batch_loss, opt, sched, amp, batching)
    return model, batching, amp


@pytest.mark.filterwarnings("ignore:Seems like `optimizer\\.step\\(\\)` has been overridden")
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


@pytest.mark.filterwarnings("ignore:Seems like `optimizer\\.step\\(\\)` has been overridden")
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
