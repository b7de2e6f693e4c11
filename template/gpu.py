"""The device: picking it, precision (AMP), the peak-memory monitor, OOM detection and the
batch probe that sizes the batch before the first fold.

GPU-only behaviour is tested through one seam: GpuMonitor's `reader` (peak bytes, total
bytes) and an injected OOM from the step the probe runs. It is machinery: `copier update`
may replace it, so keep your own code in train.py and predict.py.
"""

from __future__ import annotations

import copy
import math
import os
import time
from contextlib import nullcontext

import numpy as np
import torch

import hardware
from errors import RunError

GB = 1024**3


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RunError("--device cuda asked for, but torch sees no CUDA GPU (try --device cpu)")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    np.random.seed(seed)
    torch.manual_seed(seed)


def describe_gpu(device: torch.device) -> tuple[str, float, tuple[int, int] | None]:
    """(name, total GB, compute capability); ('none', 0.0, None) on CPU."""
    if device.type != "cuda":
        return "none", 0.0, None
    props = torch.cuda.get_device_properties(device)
    return props.name, props.total_memory / GB, (props.major, props.minor)


def free_gpu_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# cuDNN and cuBLAS report a failed workspace allocation as a plain RuntimeError, not as
# torch.OutOfMemoryError; they are the same event (the GPU is full) and get the same recovery.
OOM_MESSAGES = (
    "out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
)


def is_oom(error: BaseException) -> bool:
    if isinstance(error, torch.OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and any(m in str(error) for m in OOM_MESSAGES)


# ----------------------------------------------------------------------------- precision


class Amp:
    """Autocast + GradScaler for one mode from hardware.amp_mode(): bf16 (no scaler),
    fp16 (with GradScaler), fp32/off (plain). The whole loop calls only these methods."""

    def __init__(self, mode: str, device: torch.device):
        self.mode = mode
        self.enabled = mode in ("bf16", "fp16")
        self.device_type = device.type
        self.dtype = torch.bfloat16 if mode == "bf16" else torch.float16
        self.scaler = torch.amp.GradScaler(device.type, enabled=mode == "fp16")

    def autocast(self):
        if not self.enabled:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        self.scaler.step(optimizer)
        self.scaler.update()

    def forget_step(self, optimizer: torch.optim.Optimizer) -> None:
        """After an OOM inside step(): the scaler has already unscaled this step's gradients and
        would skip unscaling the redone ones, applying them 65536x too large. Forget that stage
        (GradScaler keeps it per optimizer in _per_optimizer_states; no public reset exists)."""
        states = getattr(self.scaler, "_per_optimizer_states", None)
        if states is not None:
            states.pop(id(optimizer), None)


# ----------------------------------------------------------------------------- GPU memory

# tune.py --workers K runs K processes on one card; each learns its share through this variable
SHARE_ENV = "KAGTPL_GPU_SHARE"
CONTEXT_GB = 0.5  # a process's CUDA context and library handles, outside the allocator (~0.3-0.5 GB)


def memory_share() -> float:
    """This process's share of its GPU (1.0 unless tune.py's workers split it), from SHARE_ENV."""
    try:
        share = float(os.environ.get(SHARE_ENV, "1"))
    except ValueError:
        return 1.0
    return min(1.0, max(0.05, share)) if math.isfinite(share) else 1.0


def share_of_card(total_bytes: int, share: float) -> tuple[float, int]:
    """(allocator cap as a fraction of the card, the bytes this process's percentages are of).
    The cap leaves this process's context outside its share, so K workers at their caps still fit."""
    mine = int(total_bytes * share)
    return max(0.01, (mine - CONTEXT_GB * GB) / total_bytes), mine


class GpuMonitor:
    """Peak GPU memory of a window (a step or an epoch).

    Seam for tests: `reader()` returns (peak_bytes_since_reset, total_bytes) and `reset()`
    starts a new window. On CUDA the peak is torch.cuda.max_memory_reserved plus the memory
    outside PyTorch's allocator (context, library handles), against mem_get_info's total; on
    CPU there is no reader and every figure prints as 'none'. We report the *peak*:
    memory_allocated() after backward has already freed the activations and under-reports the
    real need several-fold, and allocated memory alone ignores what the cache holds.
    """

    def __init__(self, device: torch.device, reader=None, reset=None):
        if reader is None and device.type == "cuda":
            # What the card has to give is the caching allocator's *reserved* memory (allocated plus
            # its cached blocks) plus what is not ours to allocate: the CUDA context, cuBLAS/cuDNN
            # handles, other processes; measured once here, against mem_get_info's total.
            free, total = torch.cuda.mem_get_info(device)
            outside = max(0, total - free - torch.cuda.memory_reserved(device))
            share = memory_share()
            if share < 1:  # tune.py's workers: the other workers' memory is not ours to count
                cap, total = share_of_card(total, share)
                torch.cuda.set_per_process_memory_fraction(cap, device)  # past it: a real OOM, as on a full card
                outside = int(CONTEXT_GB * GB)
            reader = lambda: (torch.cuda.max_memory_reserved(device) + outside, total)  # noqa: E731
            reset = lambda: torch.cuda.reset_peak_memory_stats(device)  # noqa: E731
        self._reader, self._reset = reader, reset

    def reset(self) -> None:
        if self._reset is not None:
            self._reset()

    def peak(self) -> tuple[float, float, float] | None:
        """(used GB, total GB, percent) of the current window, or None without a GPU."""
        if self._reader is None:
            return None
        used, total = self._reader()
        return used / GB, total / GB, 100.0 * used / total

    def field(self) -> str:
        """The GPU= field of the epoch line: '18.31GB (76.3%)' or 'none'."""
        p = self.peak()
        return "none" if p is None else f"{p[0]:.2f}GB ({p[2]:.1f}%)"


# ----------------------------------------------------------------------------- batch probe


PROBE_STEPS = 3  # timed steps per candidate, after one warm-up step at its shape
WITHIN = 0.95  # keep the smallest batch within 5% of the best samples/s: more steps an epoch, same speed


def probe_batch(
    step, model, optimizer, amp, batch, accum, size_class, monitor, max_batch, lr_for, log=print, clock=None, sync=None
):
    """Measure real training steps at growing batch sizes (multiples of 8, doubling) before the
    first fold, and keep the smallest batch within 5% of the best samples/s that stays under the
    90% memory ceiling. Throughput, not memory, is the objective: past the GPU's saturation a
    bigger batch only costs optimizer steps. Growing stops at an OOM, at the ceiling, at
    `max_batch` (which keeps enough optimizer steps an epoch), or when doubling gains < 5%.

    Each candidate: one warm-up step (cuDNN autotunes each new shape, and its workspace spike
    would be read as the need), then the peak is reset and PROBE_STEPS steps are timed, synced.
    `step(b)` runs one real training step at micro-batch b; `clock` and `sync` are the seam
    (time.perf_counter and torch.cuda.synchronize by default). The weights, the optimizer and the
    GradScaler are restored afterwards: probing does not train the model. Returns (batch, accum,
    lr): below the intended effective batch, accumulation rises and the micro-batch is the
    smallest that keeps the effective batch (96 fits, effective 128 -> 64 x 2); at or above it,
    accumulation is 1. `lr_for(effective)` is the run's LR rule (hardware.scaled_lr on --lr).
    """
    clock = clock or time.perf_counter
    sync = sync or (torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None))
    target, ceiling = hardware.TARGET_PCT[size_class], hardware.BAND_MAX_PCT
    saved = (copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()), amp.scaler.state_dict())
    total_gb = None

    def trial(b: int) -> tuple[float, float] | None:
        """(samples/s, peak memory %) of b, or None when it does not fit."""
        nonlocal total_gb
        free_gpu_memory()
        try:
            step(b)  # warm-up at this shape
            sync()
            monitor.reset()  # the steady need, not the first step's autotune spike
            t0 = clock()
            for _ in range(PROBE_STEPS):
                step(b)
            sync()
            seconds = clock() - t0
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if not is_oom(e):
                raise
            optimizer.zero_grad(set_to_none=True)
            amp.forget_step(optimizer)
            free_gpu_memory()
            log(f"PROBE: batch={b} -> out of memory")
            return None
        used, total_gb, pct = monitor.peak()
        rate = b * PROBE_STEPS / max(seconds, 1e-9)
        verdict = "over the 90% ceiling" if pct > ceiling else "below target" if pct < target else "in band"
        log(f"PROBE: batch={b} -> {rate:.0f} samples/s, {used:.2f} GB ({pct:.1f}%) {verdict}")
        return (rate, pct) if pct <= ceiling else None

    log(
        f"BATCH PROBE: {size_class} model, fastest batch within 5% of the best samples/s, memory ceiling "
        f"{ceiling:.0f}% (the decision matrix's target >= {target:.0f}% is reported, not pursued)"
    )
    start = batch
    b = max(8, hardware.round_to(batch, 8))
    measured: dict[int, tuple[float, float]] = {}
    result = trial(b)
    while result is None and b > 8:  # the rule's batch does not fit: halve until one does
        b = max(8, hardware.round_to(b // 2, 8))
        result = trial(b)
    if result is None:
        raise RunError("not even a batch of 8 fits in GPU memory")
    measured[b] = result
    while b * 2 <= max_batch:
        best_rate = max(r for r, _ in measured.values())
        result = trial(b * 2)
        if result is None:
            break
        b *= 2
        measured[b] = result
        if result[0] < best_rate / WITHIN:  # doubling gained < 5%: the GPU is saturated
            break
    model.load_state_dict(saved[0])
    optimizer.load_state_dict(saved[1])
    amp.forget_step(optimizer)
    if saved[2]:  # an enabled GradScaler (fp16): back to its state before the probe, fresh
        amp.scaler.load_state_dict(saved[2])
    optimizer.zero_grad(set_to_none=True)

    best_rate = max(r for r, _ in measured.values())
    chosen = min(c for c, (r, _) in measured.items() if r >= WITHIN * best_rate)
    rate, pct = measured[chosen]
    effective = start * accum
    if chosen < effective:  # a smaller micro-batch is as fast: more accumulation, same effective batch
        new_accum = math.ceil(effective / chosen)
        batch = math.ceil(effective / new_accum)
    else:
        batch, new_accum = chosen, 1
    lr, new_lr = lr_for(effective), lr_for(batch * new_accum)
    fastest = max(measured, key=lambda c: measured[c][0])
    log(
        f"BATCH PROBE: batch {start} x {accum} -> {batch} x {new_accum} ({chosen}: {rate:.0f} samples/s, "
        f"{rate / best_rate:.0%} of the best ({fastest}: {best_rate:.0f}/s), {pct:.1f}% of {total_gb:.1f} GB), "
        f"effective batch {effective} -> {batch * new_accum}, lr {lr:.2e} -> {new_lr:.2e}"
        + (" (sqrt scaling)" if new_lr != lr else "")
    )
    return batch, new_accum, new_lr
