"""The batch probe: before the first fold on CUDA, real training steps timed at growing batch
sizes pick the batch (and the validation batch on its own); under DDP every rank takes the
smallest. docs/gpu-check.md gives its rules. It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import copy
import math
import time

import torch

from . import hardware, parallel, profiles, storage
from .errors import RunError
from .gpu import free_gpu_memory, is_oom
from .steps import set_lr, to_device

PROBE_STEPS = 3  # timed steps per candidate, after one warm-up step at its shape

WITHIN = 0.95  # keep the smallest batch within 5% of the best samples/s: more steps an epoch, same speed

SMALL_BATCH = 8  # below it, candidates halve one by one down to 1 (large models on a T4, 512 px CNNs)


def snapshot(model, optimizer, amp) -> tuple:
    """The weights, optimizer and GradScaler state, copied to host memory: a copy on the GPU would
    hold the model's size (1.7 GB for deberta-v3-large) out of every candidate's memory."""

    def to_host(obj):
        if isinstance(obj, torch.Tensor):
            return obj.detach().to("cpu", copy=True)
        if isinstance(obj, dict):
            return {k: to_host(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(to_host(v) for v in obj)
        return copy.deepcopy(obj)

    return to_host(storage.model_state(model)), to_host(optimizer.state_dict()), amp.scaler.state_dict()


def restore(saved: tuple, model, optimizer, amp) -> None:
    """Back to the snapshot: load_state_dict copies into the model's own (device) tensors, and the
    optimizer's state is moved to its parameters' device by load_state_dict itself."""
    storage.load_model_state(model, saved[0])
    optimizer.load_state_dict(saved[1])
    amp.forget_step(optimizer)
    if saved[2]:  # an enabled GradScaler (fp16): back to its state before the probe, fresh
        amp.scaler.load_state_dict(saved[2])
    optimizer.zero_grad(set_to_none=True)


def probe_batch(
    fetch,
    step,
    model,
    optimizer,
    amp,
    batch,
    accum,
    size_class,
    monitor,
    max_batch,
    lr_for,
    log=print,
    clock=None,
    sync=None,
    cap_why="",
):
    """Measure real training steps at growing batch sizes (multiples of 8, doubling) before the
    first fold, and keep the smallest batch within 5% of the best samples/s that stays under the
    90% memory ceiling. Throughput, not memory, is the objective: past the GPU's saturation a
    bigger batch only costs optimizer steps. Growing stops at an OOM, at the ceiling, at
    `max_batch` (which keeps enough optimizer steps an epoch), or when doubling gains < 5%.

    Each candidate: `fetch(b)` takes one batch of b rows from the project's loader and puts it on
    the device, outside the timer (a new loader forks its workers and augments a whole batch: on
    an H100 that costs more than the step); one warm-up step (cuDNN autotunes each new shape);
    then empty_cache() returns the warm-up's workspace to the driver (reset_peak_memory_stats
    resets the peak to the memory still *reserved*, cached blocks included), the peak is reset,
    and PROBE_STEPS steps on that batch are timed, synced. `step(batch)` runs one real training
    step; `clock` and `sync` are the seam (time.perf_counter and torch.cuda.synchronize by
    default). The weights, the optimizer and the GradScaler are restored afterwards from a copy
    in host memory: probing does not train the model. A batch under 8 is accepted with a warning
    (the flags that buy memory). Returns (batch, accum, lr): below the intended effective batch,
    accumulation rises and the micro-batch is the smallest that keeps the effective batch (96
    fits, effective 128 -> 64 x 2); at or above it, accumulation is 1. `lr_for(effective)` is the
    run's LR rule (hardware.scaled_lr on --lr). `cap_why` says where `max_batch` comes from (small
    data: enough optimizer steps an epoch). Returns (batch, accum, lr, why): `why` is the batch's
    reason as (key, detail) for the VALIDATION line and `kagtpl doctor`: `probe` (the fastest),
    `oom` (the next candidate ran out of memory), `small-data` (the cap chose it).
    """
    clock = clock or time.perf_counter
    sync = sync or (torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None))
    target, ceiling = profiles.TARGET_PCT[size_class], profiles.BAND_MAX_PCT
    saved = snapshot(model, optimizer, amp)
    trial = Trial(fetch, step, optimizer, amp, monitor, (clock, sync), log, ceiling, target)
    log(
        f"BATCH PROBE: {size_class} model, fastest batch within 5% of the best samples/s, memory ceiling "
        f"{ceiling:.0f}% (the decision matrix's target >= {target:.0f}% is reported, not pursued)"
    )
    try:
        measured, stop = grow(trial, batch, max_batch, cap_why or ("probe", f"the probe's cap of {max_batch}"))
    finally:
        restore(saved, model, optimizer, amp)
    return choose(measured, batch, accum, lr_for, trial.total_gb, log, stop)


class Trial:
    """One candidate batch, timed: `trial(b)` is (samples/s, peak memory %) of b, or None when it
    does not fit (an OOM, or over the memory ceiling)."""

    def __init__(self, fetch, step, optimizer, amp, monitor, timers: tuple, log, ceiling: float, target: float):
        self.fetch, self.step, self.optimizer, self.amp, self.monitor = fetch, step, optimizer, amp, monitor
        (self.clock, self.sync), self.log, self.ceiling, self.target = timers, log, ceiling, target
        self.total_gb, self.first = None, True
        self.missed: tuple[str, str] | None = None  # the last candidate that did not fit, as a (key, detail) why

    def __call__(self, b: int) -> tuple[float, float] | None:
        free_gpu_memory()
        try:
            seconds = self.timed(b)
        except RuntimeError as e:  # OutOfMemoryError is one
            if not is_oom(e):
                raise
            self.optimizer.zero_grad(set_to_none=True)
            self.amp.forget_step(self.optimizer)
            free_gpu_memory()
            self.log(f"PROBE: batch={b} -> out of memory")
            self.missed = ("oom", f"batch {b} ran out of memory in the probe")
            return None
        used, self.total_gb, pct = self.monitor.peak()
        rate = b * PROBE_STEPS / max(seconds, 1e-9)
        verdict = "over the 90% ceiling" if pct > self.ceiling else "below target" if pct < self.target else "in band"
        self.log(f"PROBE: batch={b} -> {rate:.0f} samples/s, {used:.2f} GB ({pct:.1f}%) {verdict}")
        if pct > self.ceiling:
            self.missed = ("probe", f"batch {b} needs {pct:.0f}% of memory, over the 90% ceiling")
            return None
        return rate, pct

    def timed(self, b: int) -> float:
        """Seconds for PROBE_STEPS steps on one fetched batch of b rows, after a warm-up step."""
        rows = self.fetch(b)  # untimed: the loader's start and one batch of augmentation
        self.step(rows)  # warm-up at this shape
        self.sync()
        if self.first:  # cuBLAS/cuDNN handles exist now: they are outside the allocator
            self.monitor.measure_outside()
            self.first = False
        free_gpu_memory()  # the autotune workspace is cached, not freed, until this
        self.monitor.reset()  # the steady need, not the first step's autotune spike
        t0 = self.clock()
        for _ in range(PROBE_STEPS):
            self.step(rows)
        self.sync()
        return self.clock() - t0


def smaller(b: int) -> int:
    return max(SMALL_BATCH, hardware.round_to(b // 2, 8)) if b > SMALL_BATCH else b // 2


def grow(
    trial: Trial, batch: int, max_batch: int, cap_why: tuple
) -> tuple[dict[int, tuple[float, float]], tuple | None]:
    """The candidates measured, from the rule's batch (halved until one fits, down to 1),
    doubling until an OOM, the ceiling, `max_batch` or a gain under 5%; and why growing stopped,
    as a (key, detail) why: the candidate that did not fit, `cap_why` (max_batch), or None (a
    gain under 5%: the GPU is saturated)."""
    b = max(SMALL_BATCH, hardware.round_to(batch, 8)) if batch >= SMALL_BATCH else max(1, batch)
    result = trial(b)
    while result is None and b > 1:  # the rule's batch does not fit: halve until one does
        b = smaller(b)
        result = trial(b)
    if result is None:
        raise RunError(
            "not even a batch of 1 fits in GPU memory: use --grad-checkpointing (text), a smaller --image-size "
            "or --max-len, or a smaller model"
        )
    measured, stop = {b: result}, trial.missed or cap_why  # halved to b: the miss above it is why
    while b * 2 <= max_batch:
        best_rate = max(r for r, _ in measured.values())
        nxt = b * 2 if b * 2 <= SMALL_BATCH or b % 8 == 0 else hardware.round_to(b * 2, 8)
        result = trial(nxt)
        if result is None:
            stop = trial.missed
            break
        b = nxt
        measured[b] = result
        if result[0] < best_rate / WITHIN:  # doubling gained < 5%: the GPU is saturated
            stop = None
            break
    return measured, stop


def choose(measured: dict, start: int, accum: int, lr_for, total_gb, log, stop=None) -> tuple[int, int, float, tuple]:
    """The smallest batch within 5% of the best samples/s, as (batch, accum, lr, why) keeping the
    intended effective batch; the BATCH PROBE line (and a WARNING under 8). `stop` is why growing
    stopped, as a (key, detail) why: it is the batch's why when the largest candidate won, and
    the line says so when the probe had only one candidate (nothing to choose from)."""
    best_rate = max(r for r, _ in measured.values())
    chosen = min(c for c, (r, _) in measured.items() if r >= WITHIN * best_rate)
    rate, pct = measured[chosen]
    if chosen < SMALL_BATCH:
        log(
            f"WARNING: only a batch of {chosen} fits: training goes on at {chosen} with accumulation (BatchNorm "
            "statistics get noisy below 8); for a bigger batch use --grad-checkpointing (text), a smaller "
            "--image-size or --max-len"
        )
    effective = start * accum
    if chosen < effective:  # a smaller micro-batch is as fast: more accumulation, same effective batch
        new_accum = math.ceil(effective / chosen)
        batch = math.ceil(effective / new_accum)
    else:
        batch, new_accum = chosen, 1
    lr, new_lr = lr_for(effective), lr_for(batch * new_accum)
    fastest = max(measured, key=lambda c: measured[c][0])
    why = ("probe", "the fastest within 5% of the best samples/s: a bigger batch was no faster")
    if chosen == max(measured) and stop:
        why = stop
    share = f"{rate / best_rate:.0%} of the best ({fastest}: {best_rate:.0f}/s)"
    if len(measured) == 1:  # one measurement: nothing to choose from, and why
        share = f"the only candidate, nothing to choose from: {why[1]}"
    log(
        f"BATCH PROBE: batch {start} x {accum} -> {batch} x {new_accum} ({chosen}: {rate:.0f} samples/s, "
        f"{share}, {pct:.1f}% of {total_gb:.1f} GB), effective batch {effective} -> {batch * new_accum}, "
        f"lr {lr:.2e} -> {new_lr:.2e}" + (" (sqrt scaling)" if new_lr != lr else "")
    )
    return batch, new_accum, new_lr, why


def probe_eval_batch(fetch, predict, batch, monitor, log=print) -> int:
    """The validation batch, sized on its own after the training batch: no gradients and no
    optimizer state, so it starts at 2x the training batch and halves until one forward pass fits
    under the 90% ceiling. A validation OOM then never touches the training batch (transformers
    #32215: one halved both). `fetch(b)` takes a batch of b rows from the *validation* loader: its
    shape is not the training batch's (audio's grid of windows per clip, segmentation's tiles,
    detection's whole images, text's longest rows first), and the competition's predict expects
    it. `predict(rows)` runs one no-grad forward of the competition's predict; returns the batch
    (at least 1)."""
    b = max(1, 2 * batch)
    while True:
        free_gpu_memory()
        try:
            rows = fetch(b)
            monitor.reset()
            predict(rows)
            del rows
            peak = monitor.peak()
            pct = peak[2] if peak else 0.0
        except RuntimeError as e:
            if not is_oom(e):
                raise
            pct = math.inf
        if pct <= profiles.BAND_MAX_PCT or b == 1:
            free_gpu_memory()
            log(f"EVAL BATCH: {b} (2x the training batch {batch}, halved until a forward pass fits under 90%)")
            return b
        b = max(1, b // 2)


def autoscale(comp, fold, n_train: int, model, optimizer, machine, batching, base_lr, clock=None) -> None:
    """Before the first fold, on CUDA, unless --batch-size or --accum-steps were given: time real
    training steps at growing batch sizes (probe_batch) and keep the smallest batch within 5%
    of the best samples/s under the memory ceiling; then size the validation batch on its own
    (probe_eval_batch). The result is written to `batching` (and the optimizer's LR). `clock`
    is the probe's timer (time.perf_counter; the tests' fake GPU passes its own)."""

    def fetch(b: int, rows=fold.train, train: bool = True):  # one batch of the project's own loader, on the device
        return to_device(next(iter(comp.loader(rows, b, train=train))), machine)

    def fetch_valid(b: int):  # validation's batches: predict's shape (a training batch crashed audio's, H100)
        return fetch(b, fold.valid, train=False)

    def step(batch) -> None:
        model.train()
        optimizer.zero_grad(set_to_none=True)
        with machine.amp.autocast():
            loss, _ = comp.batch_loss(model, batch)
        machine.amp.backward(loss)
        machine.amp.step(optimizer)

    @torch.no_grad()
    def forward(batch) -> None:
        model.eval()
        with machine.amp.autocast():
            comp.predict(model, batch)

    size_class = hardware.size_class(comp.name, sum(p.numel() for p in model.parameters()) / 1e6)
    by_rows = n_train // hardware.MIN_STEPS_PER_EPOCH  # enough optimizer steps an epoch
    max_batch = max(batching.size, min(4096, by_rows))
    steps = f"{n_train} training rows: at least {hardware.MIN_STEPS_PER_EPOCH} optimizer steps an epoch"
    cap_why = ("small-data", steps) if by_rows <= max(batching.size, 4096) else None
    batching.size, batching.accum_steps, batching.lr, batching.why = probe_batch(
        fetch,
        step,
        model,
        optimizer,
        machine.amp,
        batching.size,
        batching.accum_steps,
        size_class,
        machine.monitor,
        max_batch,
        lambda effective: hardware.scaled_lr(base_lr, effective),
        clock=clock,
        cap_why=cap_why,
    )
    set_lr(optimizer, batching.lr)
    batching.eval_size = probe_eval_batch(fetch_valid, forward, batching.size, machine.monitor)
    model.train()


def agree_batching(batching, base_lr: float, device, optimizer) -> None:
    """DDP: every rank probed its own GPU; all take the smallest batch (the fullest GPU decides)
    and the most accumulation, so the steps stay in lockstep and fit everywhere."""
    if batching.world == 1:
        return
    batching.size = parallel.smallest(batching.size, device)
    batching.accum_steps = -parallel.smallest(-batching.accum_steps, device)
    if batching.eval_size:
        batching.eval_size = parallel.smallest(batching.eval_size, device)
    batching.lr = hardware.scaled_lr(base_lr, batching.effective)
    set_lr(optimizer, batching.lr)
