"""The device: picking it, precision (AMP), the peak-memory monitor, OOM detection and the
batch probe that sizes the batch before the first fold.

GPU-only behaviour is tested through one seam: the functions of `torch.cuda` this file calls
(kagtpl's tests replace them with strict fakes that check their arguments as PyTorch does and
model the caching allocator), a clock, and an injected OOM from the step the probe runs. It is
machinery: `copier update` may replace it, so keep your own code in train.py and predict.py.
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
    """--device: auto (CUDA when torch sees a card), cpu or cuda. A card this torch has no kernels
    for is a RunError here, before any data is read (check_kernels)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RunError("--device cuda asked for, but torch sees no CUDA GPU (try --device cpu)")
    device = torch.device(name)
    if device.type == "cuda":
        check_kernels(device)
    return device


def runs_on(arch_list: list[str], capability: tuple[int, int]) -> bool:
    """Whether a torch build with these targets (torch.cuda.get_arch_list(): sm_75, sm_80, compute_90,
    ...) has code for a card of this compute capability: a cubin for the same major version and a
    minor version no higher (sm_80 code runs on an sm_86 card), or PTX for an older or equal
    capability, which the driver compiles."""
    major, minor = capability
    for arch in arch_list:
        kind, _, number = arch.partition("_")
        digits = "".join(ch for ch in number if ch.isdigit())  # sm_90a, sm_100f: the digits
        if len(digits) < 2:
            continue
        a_major, a_minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return False


def check_kernels(device: torch.device) -> None:
    """The card against the installed torch's CUDA targets: Kaggle's P100 is sm_60, which recent CUDA
    12.8+ wheels no longer build for; without this, the first kernel fails with 'no kernel image is
    available for execution on the device' as a traceback, in train.py and predict.py alike."""
    arch_list = torch.cuda.get_arch_list()
    major, minor = torch.cuda.get_device_capability(device)
    if not arch_list or runs_on(arch_list, (major, minor)):
        return
    name = torch.cuda.get_device_name(device)
    raise RunError(
        f"GPU {name} (compute capability {major}.{minor}, sm_{major}{minor}) cannot run this torch "
        f"{torch.__version__} (CUDA {torch.version.cuda}, built for {' '.join(arch_list)}): run with "
        f"--device cpu, or install a torch wheel built for sm_{major}{minor} (CUDA 12.6 wheels still have "
        f"sm_60-sm_90: pip install torch --index-url https://download.pytorch.org/whl/cu126)"
    )


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
    """Cached blocks back to the driver: the caching allocator keeps every freed block reserved
    (a cuDNN workspace, the last fold's model) until this is called."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# torch.OutOfMemoryError is new in torch 2.5; torch.cuda.OutOfMemoryError (1.13+) is the same class.
# Every `except` names this one, so the first real OOM on an older torch is caught, not an AttributeError.
OutOfMemoryError = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError

# cuDNN and cuBLAS report a failed workspace allocation as a plain RuntimeError, not as
# OutOfMemoryError; they are the same event (the GPU is full) and get the same recovery.
OOM_MESSAGES = (
    "out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE",
)


def is_oom(error: BaseException) -> bool:
    if isinstance(error, OutOfMemoryError):
        return True
    return isinstance(error, RuntimeError) and any(m in str(error) for m in OOM_MESSAGES)


# ----------------------------------------------------------------------------- precision


def training_amp(flag: str, capability: tuple[int, int] | None) -> tuple[str, str]:
    """(mode, warning or '') for train.py's --amp on this device. auto: bf16 on compute capability
    >= 8, fp16 + GradScaler on 7.x, fp32 below (P100) and off on CPU. --amp bf16 on a card without
    native bf16 (T4, V100) would run emulated, several times slower: fp16 + GradScaler instead."""
    if flag == "auto":
        mode = hardware.amp_mode(capability)
        if mode == "fp32":
            return mode, f"compute capability {capability} has no tensor cores: training in fp32 (AMP off)"
        return mode, ""
    if flag == "bf16" and capability is not None and hardware.amp_mode(capability) != "bf16":
        cc = "{}.{}".format(*capability)
        return "fp16", f"--amp bf16 on compute capability {cc} (no native bf16, emulated and slow): fp16 + GradScaler"
    return flag, ""


def inference_amp(trained: str | None, capability: tuple[int, int] | None) -> tuple[str, str]:
    """(mode, why) for predict.py: the precision the checkpoint was trained with, where this device
    runs it natively, else fp32. A model trained in fp32 (mDeBERTa on a T4, --amp fp32) overflows
    fp16: predicting it in fp16 gives NaN in every fold. A bf16 model on a card without bf16 runs
    in fp32 (fp16 has less range than bf16). On CPU: fp32 (autocast only slows it down)."""
    if capability is None:
        return "off", f"CPU (trained in {trained or 'an unrecorded precision'}): fp32"
    if trained == "fp16" or (trained == "bf16" and hardware.amp_mode(capability) == "bf16"):
        return trained, f"trained in {trained}"
    if trained == "bf16":
        return "fp32", "trained in bf16, which this card has no native support for: fp32"
    if trained in ("fp32", "off"):
        return "fp32", f"trained in {trained}"
    if trained == "mixed":
        return "fp32", "the folds were trained in different precisions: fp32"
    return "fp32", "the checkpoint does not say how it was trained: fp32"


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

    On CUDA the peak is torch.cuda.max_memory_reserved plus the memory outside PyTorch's
    allocator (context, cuBLAS/cuDNN handles, other processes), against mem_get_info's total;
    on CPU there is no reader and every figure prints as 'none'. Tests pass `reader` and `reset`,
    or replace torch.cuda's functions with strict fakes. We report the *peak*: memory_allocated()
    after backward has already freed the activations and under-reports the real need
    several-fold, and allocated memory alone ignores what the cache holds. Note that
    reset_peak_memory_stats resets the peak to the *current* reserved memory: blocks the cache
    still holds count until empty_cache() returns them.
    """

    def __init__(self, device: torch.device, reader=None, reset=None):
        self.index, self.share, self.total, self.outside = None, 1.0, 0, 0
        if reader is None and device.type == "cuda":
            # the allocator's functions want the card's index: set_per_process_memory_fraction refuses
            # torch.device("cuda") (ValueError: "Expected a torch.device with a specified index")
            self.index = device.index if device.index is not None else torch.cuda.current_device()
            self.total = torch.cuda.mem_get_info(self.index)[1]
            self.share = memory_share()
            if self.share < 1:  # tune.py's workers: the other workers' memory is not ours to count
                cap, self.total = share_of_card(self.total, self.share)
                torch.cuda.set_per_process_memory_fraction(cap, self.index)  # past it: a real OOM
            self.measure_outside()
            reader = lambda: (torch.cuda.max_memory_reserved(self.index) + self.outside, self.total)  # noqa: E731
            reset = lambda: torch.cuda.reset_peak_memory_stats(self.index)  # noqa: E731
        self._reader, self._reset = reader, reset

    def measure_outside(self) -> None:
        """What the card has given that is not the allocator's: the context, cuBLAS/cuDNN handles
        (created at the first matmul and convolution, so read again after the first real step),
        other processes. tune.py's workers count their own context only (the rest is theirs)."""
        if self.index is None:
            return
        if self.share < 1:
            self.outside = int(CONTEXT_GB * GB)
            return
        free, total = torch.cuda.mem_get_info(self.index)
        self.outside = max(0, total - free - torch.cuda.memory_reserved(self.index))

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

    return to_host(model.state_dict()), to_host(optimizer.state_dict()), amp.scaler.state_dict()


def restore(saved: tuple, model, optimizer, amp) -> None:
    """Back to the snapshot: load_state_dict copies into the model's own (device) tensors, and the
    optimizer's state is moved to its parameters' device by load_state_dict itself."""
    model.load_state_dict(saved[0])
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
    run's LR rule (hardware.scaled_lr on --lr).
    """
    clock = clock or time.perf_counter
    sync = sync or (torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None))
    target, ceiling = hardware.TARGET_PCT[size_class], hardware.BAND_MAX_PCT
    saved = snapshot(model, optimizer, amp)
    total_gb, first = None, True

    def trial(b: int) -> tuple[float, float] | None:
        """(samples/s, peak memory %) of b, or None when it does not fit."""
        nonlocal total_gb, first
        free_gpu_memory()
        try:
            rows = fetch(b)  # untimed: the loader's start and one batch of augmentation
            step(rows)  # warm-up at this shape
            sync()
            if first:  # cuBLAS/cuDNN handles exist now: they are outside the allocator
                monitor.measure_outside()
                first = False
            free_gpu_memory()  # the autotune workspace is cached, not freed, until this
            monitor.reset()  # the steady need, not the first step's autotune spike
            t0 = clock()
            for _ in range(PROBE_STEPS):
                step(rows)
            sync()
            seconds = clock() - t0
        except RuntimeError as e:  # OutOfMemoryError is one
            if not is_oom(e):
                raise
            rows = None
            optimizer.zero_grad(set_to_none=True)
            amp.forget_step(optimizer)
            free_gpu_memory()
            log(f"PROBE: batch={b} -> out of memory")
            return None
        del rows
        used, total_gb, pct = monitor.peak()
        rate = b * PROBE_STEPS / max(seconds, 1e-9)
        verdict = "over the 90% ceiling" if pct > ceiling else "below target" if pct < target else "in band"
        log(f"PROBE: batch={b} -> {rate:.0f} samples/s, {used:.2f} GB ({pct:.1f}%) {verdict}")
        return (rate, pct) if pct <= ceiling else None

    def smaller(b: int) -> int:
        return max(SMALL_BATCH, hardware.round_to(b // 2, 8)) if b > SMALL_BATCH else b // 2

    log(
        f"BATCH PROBE: {size_class} model, fastest batch within 5% of the best samples/s, memory ceiling "
        f"{ceiling:.0f}% (the decision matrix's target >= {target:.0f}% is reported, not pursued)"
    )
    start = batch
    b = max(SMALL_BATCH, hardware.round_to(batch, 8)) if batch >= SMALL_BATCH else max(1, batch)
    measured: dict[int, tuple[float, float]] = {}
    result = trial(b)
    while result is None and b > 1:  # the rule's batch does not fit: halve until one does
        b = smaller(b)
        result = trial(b)
    if result is None:
        restore(saved, model, optimizer, amp)
        raise RunError(
            "not even a batch of 1 fits in GPU memory: use --grad-checkpointing (text), a smaller --image-size "
            "or --max-len, or a smaller model"
        )
    measured[b] = result
    while b * 2 <= max_batch:
        best_rate = max(r for r, _ in measured.values())
        nxt = b * 2 if b * 2 <= SMALL_BATCH or b % 8 == 0 else hardware.round_to(b * 2, 8)
        result = trial(nxt)
        if result is None:
            break
        b = nxt
        measured[b] = result
        if result[0] < best_rate / WITHIN:  # doubling gained < 5%: the GPU is saturated
            break
    restore(saved, model, optimizer, amp)

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
    log(
        f"BATCH PROBE: batch {start} x {accum} -> {batch} x {new_accum} ({chosen}: {rate:.0f} samples/s, "
        f"{rate / best_rate:.0%} of the best ({fastest}: {best_rate:.0f}/s), {pct:.1f}% of {total_gb:.1f} GB), "
        f"effective batch {effective} -> {batch * new_accum}, lr {lr:.2e} -> {new_lr:.2e}"
        + (" (sqrt scaling)" if new_lr != lr else "")
    )
    return batch, new_accum, new_lr


def probe_eval_batch(fetch, predict, batch, monitor, log=print) -> int:
    """The validation batch, sized on its own after the training batch: no gradients and no
    optimizer state, so it starts at 2x the training batch and halves until one forward pass fits
    under the 90% ceiling. A validation OOM then never touches the training batch (transformers
    #32215: one halved both). `predict(rows)` runs one no-grad forward of the competition's
    predict; returns the batch (at least 1)."""
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
        if pct <= hardware.BAND_MAX_PCT or b == 1:
            free_gpu_memory()
            log(f"EVAL BATCH: {b} (2x the training batch {batch}, halved until a forward pass fits under 90%)")
            return b
        b = max(1, b // 2)
