"""The device: picking it, precision (AMP), the peak-memory monitor, OOM detection and the
batch probe that sizes the batch before the first fold.

GPU-only behaviour is tested through one seam: GpuMonitor's `reader` (peak bytes, total
bytes) and an injected OOM from the step the probe runs. It is machinery: `copier update`
may replace it, so keep your own code in train.py and predict.py.
"""

from __future__ import annotations

import copy
import math
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


class GpuMonitor:
    """Peak GPU memory of a window (a step or an epoch).

    Seam for tests: `reader()` returns (peak_bytes_since_reset, total_bytes) and `reset()`
    starts a new window. On CUDA they wrap torch.cuda.max_memory_allocated and
    reset_peak_memory_stats; on CPU there is no reader and every figure prints as 'none'.
    We report the *peak*: memory_allocated() after backward has already freed the
    activations and under-reports the real need several-fold.
    """

    def __init__(self, device: torch.device, reader=None, reset=None):
        if reader is None and device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory
            reader = lambda: (torch.cuda.max_memory_allocated(device), total)  # noqa: E731
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


def probe_batch(step, model, optimizer, amp, batch, accum, size_class, monitor, max_batch, lr, log=print):
    """Grow the batch before the first fold until peak GPU memory reaches the decision matrix's
    target for the model's size class (small 50%, large 70%), never above 90% (a 10% margin:
    a batch found right at the limit OOMs later). x2 first, then x1.5; an OOM steps back.

    `step(b)` runs one real training step at micro-batch b. The weights, the optimizer and the
    GradScaler are restored afterwards: probing does not train the model. Returns
    (batch, accum, lr): below the intended effective batch, accumulation rises and the micro-batch
    is the smallest that keeps the effective batch exactly (96 fits, effective 128 -> 64 x 2);
    at or above it, accumulation is 1 and the LR scales by sqrt(new effective / old) (square-root
    scaling, the rule for Adam-type optimizers).
    """
    target, ceiling = hardware.TARGET_PCT[size_class], hardware.BAND_MAX_PCT
    saved = (copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()), amp.scaler.state_dict())
    total_gb = None

    def trial(b: int) -> float | None:
        nonlocal total_gb
        free_gpu_memory()
        monitor.reset()
        try:
            step(b)
        except (torch.OutOfMemoryError, RuntimeError) as e:
            if not is_oom(e):
                raise
            optimizer.zero_grad(set_to_none=True)
            amp.forget_step(optimizer)
            free_gpu_memory()
            log(f"PROBE: batch={b} -> out of memory")
            return None
        used, total_gb, pct = monitor.peak()
        verdict = "over the 90% ceiling" if pct > ceiling else "below target" if pct < target else "in band"
        log(f"PROBE: batch={b} -> {used:.2f} GB ({pct:.1f}%) {verdict}")
        return pct

    log(f"BATCH PROBE: {size_class} model, target >= {target:.0f}% of GPU memory, ceiling {ceiling:.0f}%")
    start, pct = batch, trial(batch)
    while (pct is None or pct > ceiling) and batch > 1:
        batch = max(1, batch // 2)
        pct = trial(batch)
    if pct is None:
        raise RunError("not even a batch of 1 fits in GPU memory")
    while pct < target and batch < max_batch:
        for factor in (2.0, 1.5):
            candidate = min(max_batch, hardware.round_batch(batch * factor))
            if candidate <= batch:
                continue
            p = trial(candidate)
            if p is not None and p <= ceiling:
                batch, pct = candidate, p
                break
        else:
            break
    model.load_state_dict(saved[0])
    optimizer.load_state_dict(saved[1])
    if saved[2]:  # an enabled GradScaler (fp16) has state to restore
        amp.scaler.load_state_dict(saved[2])
    optimizer.zero_grad(set_to_none=True)
    effective, best = start * accum, batch
    if batch < effective:  # memory forces a smaller micro-batch: more accumulation, same effective batch
        new_accum = math.ceil(effective / batch)
        batch = math.ceil(effective / new_accum)
    else:
        new_accum = 1
    new_lr = lr * math.sqrt(batch * new_accum / effective) if batch * new_accum > effective else lr
    log(
        f"BATCH PROBE: batch {start} x {accum} -> {batch} x {new_accum} (largest in band {best}: {pct:.1f}% of "
        f"{total_gb:.1f} GB), effective batch {effective} -> {batch * new_accum}, lr {lr:.2e} -> {new_lr:.2e}"
        + (" (sqrt scaling)" if new_lr != lr else "")
    )
    return batch, new_accum, new_lr
