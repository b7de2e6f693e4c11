"""The one seam behind which the project's GPU code runs on a machine with no GPU.

`FakeCuda` replaces the functions of `torch.cuda` that the generated project calls, and fails
where CUDA fails:
- arguments are checked by PyTorch's own code: every function resolves its device argument
  through `torch.cuda._utils._get_device_index` with the `optional` flag the real function uses
  (so `set_per_process_memory_fraction(f, torch.device("cuda"))` raises PyTorch's ValueError, as
  on a card), then the real range and type checks (`Invalid device id`, `Invalid type for
  fraction argument`, `Invalid fraction value`);
- memory is the caching allocator's: 2 MB blocks; a freed block stays *reserved* (cached) until
  `empty_cache()`; an allocation first reuses cached blocks, and when the card (or the process's
  memory fraction) is full the cache is released and the allocation retried before
  `OutOfMemoryError`; `reset_peak_memory_stats` resets the peak to the *current* reserved memory,
  not to zero; `mem_get_info` counts the context, the cuBLAS/cuDNN handles once the first kernel
  has run, other processes and the reserved memory;
- `get_arch_list` is the installed torch's own list unless a test names another.

`FakeGpu` is a training step on that card for the batch probe: weights, optimizer state from the
first step on, activations per sample, a cuDNN workspace that is live together with the
activations at a shape's first step (then cached), and a clock that charges the loader's time
(a new loader's start plus augmentation per sample) as well as the GPU's (overhead + samples /
peak rate, so samples/s saturates). Everything behind the seam (probe, monitor, restore, LR rule,
OOM recovery) is the generated project's real code.
"""

from __future__ import annotations

import math
import os
import sys
from types import SimpleNamespace

import torch
from torch.cuda._utils import _get_device_index

GB = 1024**3
BLOCK = 2 * 1024**2  # the caching allocator rounds large allocations to 2 MB blocks

# torch.cuda functions the project calls; FakeCuda.install replaces exactly these
FUNCTIONS = (
    "is_available",
    "device_count",
    "current_device",
    "set_device",
    "get_device_properties",
    "get_device_capability",
    "get_device_name",
    "get_arch_list",
    "synchronize",
    "mem_get_info",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "set_per_process_memory_fraction",
    "empty_cache",
)

# torch's optimizers ask (through torch.accelerator) whether CUDA is available to check CUDA-graph capture
# (then query its stream): they get the real answer, since the model they step lives on the CPU
REAL_CALLERS = tuple(os.sep + os.path.join("torch", d) + os.sep for d in ("optim", "accelerator"))

CARDS = {  # name, memory as torch reports it (GB), compute capability
    "t4": ("Tesla T4", 14.58, (7, 5)),
    "p100": ("Tesla P100-PCIE-16GB", 15.89, (6, 0)),
    "v100": ("Tesla V100-SXM2-16GB", 15.77, (7, 0)),
    "a10": ("NVIDIA A10", 22.07, (8, 6)),
    "a100": ("NVIDIA A100-SXM4-40GB", 39.39, (8, 0)),
    "h100": ("NVIDIA H100 80GB HBM3", 79.1, (9, 0)),
}


class FakeCuda:
    """A CUDA runtime with `count` identical cards, as torch.cuda's functions show it."""

    def __init__(
        self,
        card: str = "t4",
        total_gb: float | None = None,
        count: int = 1,
        context_gb: float = 0.4,
        handles_gb: float = 0.0,
        others_gb: float = 0.0,
        arch_list: list[str] | None = None,
    ):
        self.name, gb, self.capability = CARDS[card]
        self.total = int((total_gb if total_gb is not None else gb) * GB)
        self.count, self.current = count, 0
        self.context, self.handles, self.others = int(context_gb * GB), int(handles_gb * GB), int(others_gb * GB)
        self.handles_made = False  # cuBLAS/cuDNN create their handles at the first kernel
        self.arch_list = list(torch.cuda.get_arch_list() if arch_list is None else arch_list)
        self.fraction = 1.0
        self.allocated = self.reserved = self.peak = 0
        self.calls: list[tuple] = []

    def install(self, monkeypatch) -> FakeCuda:
        for name in FUNCTIONS:
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        return self

    # --------------------------------------------------------------- arguments, as torch checks them

    def _index(self, device, optional: bool = True) -> int:
        index = _get_device_index(device, optional=optional)  # PyTorch's own check (runs without a driver)
        if index < 0 or index >= self.count:
            raise AssertionError("Invalid device id")  # get_device_properties' check
        return index

    # --------------------------------------------------------------- devices

    def is_available(self) -> bool:
        caller = sys._getframe(1).f_code.co_filename
        return not any(part in caller for part in REAL_CALLERS)

    def device_count(self) -> int:
        return self.count

    def current_device(self) -> int:
        return self.current

    def set_device(self, device) -> None:
        index = _get_device_index(device)  # optional=False, as torch.cuda.set_device
        if index >= 0:
            self.current = self._index(index)

    def get_device_properties(self, device=None):
        self._index(device)
        major, minor = self.capability
        return SimpleNamespace(
            name=self.name, total_memory=self.total, major=major, minor=minor, multi_processor_count=40
        )

    def get_device_capability(self, device=None) -> tuple[int, int]:
        p = self.get_device_properties(device)
        return p.major, p.minor

    def get_device_name(self, device=None) -> str:
        return self.get_device_properties(device).name

    def get_arch_list(self) -> list[str]:
        return list(self.arch_list)

    def synchronize(self, device=None) -> None:
        self.calls.append(("synchronize", self._index(device)))

    # --------------------------------------------------------------- the caching allocator

    def limit(self) -> int:
        """What the allocator may reserve: the process's fraction of the card, and what is free."""
        outside = self.context + (self.handles if self.handles_made else 0) + self.others
        return min(int(self.fraction * self.total), self.total - outside)

    def malloc(self, nbytes: float) -> int:
        size = math.ceil(nbytes / BLOCK) * BLOCK
        grow = max(0, self.allocated + size - self.reserved)  # cached blocks are used first
        if self.reserved + grow > self.limit():
            self.empty_cache()  # the allocator frees its cache and retries before giving up
            grow = max(0, self.allocated + size - self.reserved)
            if self.reserved + grow > self.limit():
                raise torch.cuda.OutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate {size / GB:.2f} GiB (fake {self.name}, "
                    f"{self.reserved / GB:.2f} GiB reserved, limit {self.limit() / GB:.2f} GiB)"
                )
        self.reserved += grow
        self.allocated += size
        self.peak = max(self.peak, self.reserved)
        return size

    def free(self, size: int) -> None:
        self.allocated -= size  # the block stays reserved: cached for the next allocation

    def kernel(self) -> None:
        self.handles_made = True

    def empty_cache(self) -> None:
        self.reserved = self.allocated

    def memory_reserved(self, device=None) -> int:
        self._index(device)
        return self.reserved

    def max_memory_reserved(self, device=None) -> int:
        self._index(device)
        return self.peak

    def reset_peak_memory_stats(self, device=None) -> None:
        self._index(device)
        self.peak = self.reserved  # to the current reserved memory, cached blocks included: not 0

    def mem_get_info(self, device=None) -> tuple[int, int]:
        self._index(device)
        used = self.context + (self.handles if self.handles_made else 0) + self.others + self.reserved
        return self.total - used, self.total

    def set_per_process_memory_fraction(self, fraction, device=None) -> None:
        if device is None:
            device = self.current_device()
        index = _get_device_index(device)  # optional=False: torch.device("cuda") is a ValueError
        if not isinstance(fraction, float):
            raise TypeError("Invalid type for fraction argument, must be `float`")
        if fraction < 0 or fraction > 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        self._index(index)
        self.fraction = fraction


class FakeGpu:
    """A training step on a FakeCuda card, for the batch probe. Memory: weights (from the start),
    optimizer state (from the first step on), activations per sample, and at a batch size's first
    step a cuDNN workspace live beside them (freed after, but cached). Time on `clock()`: a step
    takes overhead + samples / peak rate; fetching a batch from a new loader takes loader_s +
    samples x loader_per_sample_s (worker start, augmentation)."""

    def __init__(
        self,
        gb_per_sample,
        total_gb=24.0,
        context_gb=0.6,
        weights_gb=0.1,
        optimizer_gb=0.2,
        spike_gb=2.0,
        overhead_s=0.05,
        peak_rate=2000.0,
        handles_gb=0.0,
        loader_s=0.0,
        loader_per_sample_s=0.0,
        card="a10",
    ):
        self.cuda = FakeCuda(card, total_gb=total_gb, context_gb=context_gb, handles_gb=handles_gb)
        self.gb_per_sample, self.total = gb_per_sample, total_gb
        self.weights, self.optimizer, self.spike = weights_gb, optimizer_gb, spike_gb
        self.overhead, self.rate = overhead_s, peak_rate
        self.loader_s, self.loader_per_sample = loader_s, loader_per_sample_s
        self.seen, self.stepped, self.now, self.steps, self.fetched = set(), False, 0.0, [], []
        self.cuda.malloc(weights_gb * GB)

    def install(self, monkeypatch) -> FakeGpu:
        self.cuda.install(monkeypatch)
        return self

    def forward(self, b: int, train: bool = True) -> None:
        """One step's memory and GPU time at b rows (train: the backward's activations and the
        optimizer state too)."""
        cuda = self.cuda
        acts = cuda.malloc(self.gb_per_sample * b * GB if train else self.gb_per_sample * b * GB / 3)
        try:
            cuda.kernel()
            if b not in self.seen:  # cuDNN autotunes this shape: a workspace beside the activations
                cuda.free(cuda.malloc(self.spike * GB))
                self.seen.add(b)
            if train and not self.stepped:
                cuda.malloc(self.optimizer * GB)  # Adam's state, kept from the first step on
                self.stepped = True
        finally:
            cuda.free(acts)
        self.now += self.overhead + b / self.rate

    def step(self, train_step, rows=len):
        """step(batch) for probe.probe_batch: the fake card's step at rows(batch), then `train_step(batch)`."""

        def step(batch):
            b = rows(batch)
            self.steps.append(b)
            self.forward(b)
            train_step(batch)

        return step

    def fetch(self, make):
        """fetch(b) for probe.probe_batch: the loader's time on the clock, then `make(b)`."""

        def fetch(b):
            self.fetched.append(b)
            self.now += self.loader_s + b * self.loader_per_sample
            return make(b)

        return fetch

    def loader(self, make_loader):
        """A project's loader(rows, batch, train, ...) whose iteration charges a new loader's time
        (worker start + augmentation of one batch) to the clock, as each probe candidate fetches."""
        gpu = self

        class Charged:
            def __init__(self, inner, batch):
                self.inner, self.batch = inner, batch

            def __len__(self):
                return len(self.inner)

            def __iter__(self):
                gpu.fetched.append(self.batch)
                gpu.now += gpu.loader_s + self.batch * gpu.loader_per_sample
                return iter(self.inner)

        return lambda rows, batch, train, **kw: Charged(make_loader(rows, batch, train, **kw), batch)

    def use(self, b: int) -> float:
        """GB the card gives to a steady step at b rows (context, weights, optimizer, activations)."""
        blocks = sum(
            math.ceil(gb * GB / BLOCK) * BLOCK for gb in (self.weights, self.optimizer, self.gb_per_sample * b)
        )
        return self.cuda.context / GB + blocks / GB

    def clock(self) -> float:
        return self.now


class ProbeBench:
    """What probe.probe_batch needs, on a FakeGpu card: a small real model (Linear, BatchNorm,
    Linear), AdamW and the project's Amp on CPU, fed through `card.fetch` and stepped through
    `card.step`, so the card's memory and clock follow every step the probe takes. `run()` probes
    with the project's own GpuMonitor on "cuda": install the card (`card.install`) first."""

    def __init__(self, modules, card: FakeGpu, amp_mode: str = "off"):
        torch.manual_seed(0)
        self.gpu, self.probe, self.card = modules.gpu, modules.probe, card
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 3))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.amp = modules.gpu.Amp(amp_mode, torch.device("cpu"))
        self.fetch = card.fetch(lambda b: (torch.randn(b, 8), torch.randint(0, 3, (b,))))
        self.step = card.step(self.train_step, rows=lambda batch: len(batch[0]))

    def train_step(self, batch) -> None:
        x, y = batch
        self.opt.zero_grad()
        with self.amp.autocast():
            loss = torch.nn.functional.cross_entropy(self.model(x).float(), y)
        self.amp.backward(loss)
        self.amp.step(self.opt)

    def run(self, start: int = 128, accum: int = 1, max_batch: int = 4096, size_class: str = "large"):
        """probe.probe_batch with the run's LR rule on --lr 1e-3: ((batch, accum, lr, why), log lines, monitor)."""
        lines = []
        monitor = self.gpu.GpuMonitor(torch.device("cuda"))
        result = self.probe.probe_batch(
            self.fetch, self.step, self.model, self.opt, self.amp, start, accum, size_class, monitor, max_batch,
            lambda effective: self.gpu.hardware.scaled_lr(1e-3, effective), log=lines.append, clock=self.card.clock,
        )  # fmt: skip
        return result, lines, monitor
