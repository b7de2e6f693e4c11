"""Batch probe choice on simulated GPUs: the generated project's probe.probe_batch, run against
tests/fake_gpu.py's model of a card (strict torch.cuda fakes with the caching allocator's rules:
context, reserved vs allocated memory, a first-step workspace that stays cached until
empty_cache, optimizer state, a saturating samples/s curve on a fake clock). For each card and data size it
prints the chosen batch's samples/s as a share of the best measured (goal >= 0.95) and the
optimizer steps an epoch it leaves (goal >= 30), beside what the former memory-filling rule
(the largest batch under the 90% ceiling) would have left.

    python benchmarks/batch_probe.py
"""

from __future__ import annotations

import re
import sys

import pytest
from _project import ROOT, rendered

sys.path.insert(0, str(ROOT / "tests"))
from fake_gpu import FakeGpu, ProbeBench  # noqa: E402

CASES = [
    # name, fake GPU, training rows
    ("resnet18-like on an H100 (80 GB), 40k images", dict(gb_per_sample=0.012, total_gb=80, peak_rate=9000), 40_000),
    ("efficientnet_b4-like on an A10 (24 GB), 10k images", dict(gb_per_sample=0.09, peak_rate=900), 10_000),
    ("resnet18-like on a T4 (16 GB), 2k images", dict(gb_per_sample=0.02, total_gb=16, peak_rate=1500), 2_000),
    ("fast small model, 80 GB, 3k images", dict(gb_per_sample=0.004, total_gb=80, peak_rate=20000), 3_000),
]


def main() -> None:
    project = rendered("image", model="resnet18", image_size=64)
    hardware = project.hardware
    print(f"batch probe on simulated GPUs (probe.probe_batch, {project.probe.PROBE_STEPS} timed steps per candidate)")
    print(f"{'case':52}{'chosen':>8}{'share of best':>15}{'steps/epoch':>13}{'fill-memory batch':>19}{'its steps':>11}")
    for name, card, rows in CASES:
        gpu = FakeGpu(**card)
        start, start_accum = hardware.fit_to_steps(128, 1, rows)  # as train.py does before the probe
        max_batch = max(start, min(4096, rows // hardware.MIN_STEPS_PER_EPOCH))  # as probe.autoscale does
        with pytest.MonkeyPatch.context() as patch:  # torch.cuda's functions: the fake card's
            gpu.install(patch)
            (batch, accum, _, _), lines, _ = ProbeBench(project, gpu).run(start, start_accum, max_batch)
        rates = {int(b): float(r) for b, r in re.findall(r"PROBE: batch=(\d+) -> (\d+) samples/s", "\n".join(lines))}
        chosen = batch if accum == 1 else min(b for b in rates if b >= batch)
        fill = max(b for b in range(8, 65536, 8) if gpu.use(b) <= 0.9 * gpu.total)
        print(
            f"{name:52}{batch * accum:>8}{rates[chosen] / max(rates.values()):>15.3f}"
            f"{rows // (batch * accum):>13}{fill:>19}{rows // fill:>11}"
        )


if __name__ == "__main__":
    main()
