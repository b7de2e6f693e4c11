"""The batch probe's log on tests/fake_gpu.py's 24 GB card (strict torch.cuda fakes, the caching
allocator's rules, a fake clock): the two blocks docs/gpu-check.md shows, one stopped by the
GPU's saturation (5 MB an image), one by memory (45 MB an image), each followed by the
validation batch the probe sizes on its own.

    python benchmarks/probe_log.py
"""

from __future__ import annotations

import sys

import pytest
import torch
from _project import ROOT, rendered

sys.path.insert(0, str(ROOT / "tests"))
from fake_gpu import FakeGpu  # noqa: E402


def main() -> None:
    m = rendered("image", model="resnet18", image_size=64)
    for gb_per_sample in (0.005, 0.045):
        gpu = FakeGpu(gb_per_sample)
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 3)
        opt = torch.optim.AdamW(model.parameters())
        amp = m.gpu.Amp("off", torch.device("cpu"))

        def train(batch, model=model, opt=opt):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(batch[0]), batch[1]).backward()
            opt.step()

        fetch = gpu.fetch(lambda b: (torch.randn(b, 8), torch.randint(0, 3, (b,))))
        step = gpu.step(train, rows=lambda batch: len(batch[0]))
        with pytest.MonkeyPatch.context() as patch:
            gpu.install(patch)
            monitor = m.gpu.GpuMonitor(torch.device("cuda"))
            batch, _, _ = m.gpu.probe_batch(
                fetch, step, model, opt, amp, 128, 1, "large", monitor, 4096, lambda e: m.hardware.scaled_lr(1e-3, e),
                clock=gpu.clock,
            )  # fmt: skip
            m.gpu.probe_eval_batch(lambda b: b, lambda b, gpu=gpu: gpu.forward(b, train=False), batch, monitor)
        print()


if __name__ == "__main__":
    main()
