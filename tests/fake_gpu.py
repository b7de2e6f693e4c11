"""A GPU as the batch probe sees it, for the tests and benchmarks/batch_probe.py: the one seam
behind which the probe, its restore and the LR rule are the generated project's real code.
It models what real CUDA does: the context's memory, reserved vs allocated memory, a cuDNN
workspace spike the first time a shape runs, the optimizer state that appears after the first
step, OOM past the card, and a saturating samples/s curve on a fake clock."""

from __future__ import annotations

import math

import torch

GB = 1024**3


class FakeGpu:
    """Memory: context + reserved, reserved = allocated (weights, optimizer state once a step has
    run, activations per sample) rounded up to 2 MB blocks x 1.1 (the caching allocator's slack),
    plus a workspace spike at a batch size's first step; OOM when that passes the card. Time: a
    step takes overhead + samples / peak rate, so samples/s saturates as the batch grows."""

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
    ):
        self.gb_per_sample, self.total, self.context = gb_per_sample, total_gb, context_gb
        self.weights, self.optimizer, self.spike = weights_gb, optimizer_gb, spike_gb
        self.overhead, self.rate = overhead_s, peak_rate
        self.seen, self.stepped, self.window_peak, self.now, self.last, self.steps = set(), False, 0.0, 0.0, 0, []

    def use(self, b: int) -> float:
        allocated = self.weights + (self.optimizer if self.stepped else 0.0) + self.gb_per_sample * b
        reserved = math.ceil(allocated * 1.1 / 0.002) * 0.002
        return self.context + reserved + (0.0 if b in self.seen else self.spike)

    def step(self, batch_fn):
        def step(b):
            self.steps.append(b)
            used = self.use(b)
            self.seen.add(b)
            if used > self.total:
                raise torch.OutOfMemoryError("fake: CUDA out of memory")
            self.window_peak = max(self.window_peak, used)
            self.last, self.now = b, self.now + self.overhead + b / self.rate
            batch_fn(b)
            self.stepped = True

        return step

    def reader(self):
        return int(self.window_peak * GB), int(self.total * GB)

    def reset(self):
        self.window_peak = 0.0

    def clock(self):
        return self.now
