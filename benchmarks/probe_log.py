"""The batch probe's log on tests/fake_gpu.py's 24 GB card (strict torch.cuda fakes, the caching
allocator's rules, a fake clock): the two blocks docs/gpu-check.md shows, one stopped by the
GPU's saturation (5 MB an image), one by memory (45 MB an image), each followed by the
validation batch the probe sizes on its own.

    python benchmarks/probe_log.py
"""

from __future__ import annotations

import sys

import pytest
from _project import ROOT, rendered

sys.path.insert(0, str(ROOT / "tests"))
from fake_gpu import FakeGpu, ProbeBench  # noqa: E402


def main() -> None:
    m = rendered("image", model="resnet18", image_size=64)
    for gb_per_sample in (0.005, 0.045):
        gpu = FakeGpu(gb_per_sample)
        with pytest.MonkeyPatch.context() as patch:  # torch.cuda's functions: the fake card's
            gpu.install(patch)
            (batch, _, _, _), lines, monitor = ProbeBench(m, gpu).run()
            print(*lines, sep="\n")
            m.probe.probe_eval_batch(lambda b: b, lambda b, gpu=gpu: gpu.forward(b, train=False), batch, monitor)
        print()


if __name__ == "__main__":
    main()
