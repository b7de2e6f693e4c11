"""The device: picking it, precision (AMP), the peak-memory monitor, OOM detection and the
batch probe that sizes the batch before the first fold.

GPU-only behaviour is tested through one seam: the functions of `torch.cuda` this file calls
(kagtpl's tests replace them with strict fakes that check their arguments as PyTorch does and
model the caching allocator), a clock, and an injected OOM from the step the probe runs. It is
machinery: `copier update` may replace it, so keep your own code in train.py and predict.py.
"""

from __future__ import annotations

import math
import os
import random
from contextlib import nullcontext

import numpy as np
import torch

from . import hardware
from .errors import RunError

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
    random.seed(seed)
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


def device_memory(device) -> int:
    """Bytes of the memory a process on `device` has: this process's share of the card
    (memory_share), or the host's RAM on a CPU."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory * memory_share())
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


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
