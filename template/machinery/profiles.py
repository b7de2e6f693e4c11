"""The GPU profiles kagtpl knows (memory, compute capability, vCPUs), the precision each runs,
the profile of the card this machine has (a listed one, or one built from an unlisted card), and
the memory band a card is kept in (the decision matrix the probe and `kagtpl doctor` apply).

Pure Python, no torch: kagtpl's generator imports it too (`kagtpl gpus`, `kagtpl new --gpu
auto`); hardware.py's rules read these profiles. It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    name: str
    label: str
    memory_gb: float  # per GPU, as sold; 0 for CPU
    capability: tuple[int, int] | None  # CUDA compute capability; None for CPU
    vcpus: int  # typical vCPUs of a machine with this GPU
    gpus: int = 1
    note: str = ""

    @property
    def is_gpu(self) -> bool:
        return self.capability is not None

    @property
    def bf16_native(self) -> bool:
        # Compute capability >= 8 (Ampere+). torch.cuda.is_bf16_supported() says yes
        # on T4/V100 too, through slow emulation, so we never ask it.
        return self.capability is not None and self.capability >= (8, 0)


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in [
        Profile("t4", "NVIDIA T4 (Kaggle)", 16, (7, 5), 4, note="Kaggle default"),
        Profile("t4x2", "2x NVIDIA T4 (Kaggle)", 16, (7, 5), 4, gpus=2, note="one fold per T4 (--parallel auto)"),
        Profile("p100", "NVIDIA P100", 16, (6, 0), 4, note="retired on Kaggle 2026-09; fp32"),
        Profile("v100", "NVIDIA V100 16GB", 16, (7, 0), 8),
        Profile("v100-32", "NVIDIA V100 32GB", 32, (7, 0), 8),
        Profile("a10", "NVIDIA A10", 24, (8, 6), 30),
        Profile("a10g", "NVIDIA A10G", 24, (8, 6), 8),
        Profile("l4", "NVIDIA L4", 24, (8, 9), 8),
        Profile("a100-40", "NVIDIA A100 40GB", 40, (8, 0), 12),
        Profile("a100-80", "NVIDIA A100 80GB", 80, (8, 0), 12),
        Profile("h100", "NVIDIA H100 80GB", 80, (9, 0), 26),
        Profile("h200", "NVIDIA H200", 141, (9, 0), 26),
        Profile("b200", "NVIDIA B200", 180, (10, 0), 28),
        Profile("l40s", "NVIDIA L40S", 48, (8, 9), 16),
        Profile("a40", "NVIDIA A40", 48, (8, 6), 16),
        Profile("rtx-a6000", "NVIDIA RTX A6000", 48, (8, 6), 16),
        Profile("rtx3090", "NVIDIA RTX 3090", 24, (8, 6), 16),
        Profile("rtx4090", "NVIDIA RTX 4090", 24, (8, 9), 16),
        Profile("cpu", "CPU only", 0, None, os.cpu_count() or 2),
    ]
}

KAGGLE_PROFILES = ("t4", "t4x2", "p100")

DEFAULT_PROFILE = "t4"  # Kaggle's default accelerator: copier.yml's `gpu` default


def amp_mode(capability: tuple[int, int] | None) -> str:
    """'bf16', 'fp16' or 'off'. Takes the capability so tests can pass any GPU's."""
    if capability is None:
        return "off"  # CPU: no native bf16 here, autocast would only slow it down
    if capability >= (8, 0):
        return "bf16"  # native bf16: same range as fp32, no GradScaler needed
    if capability >= (7, 0):
        return "fp16"  # T4/V100 tensor cores: fp16 + GradScaler
    return "fp32"  # P100 and older: no tensor cores, fp16 saves memory but adds risk


def profile_from_gpu_name(name: str, memory_gb: float) -> str:
    """Map a device name (nvidia-smi or torch) to a profile name; 'cpu' if it is not in the table
    (profile_for() then builds one from the card's memory and compute capability)."""
    n = name.lower()
    table = [
        ("h100", "h100"),
        ("h200", "h200"),
        ("b200", "b200"),
        ("l40s", "l40s"),
        ("a6000", "rtx-a6000"),
        ("a40", "a40"),
        ("a100", "a100-80" if memory_gb > 45 else "a100-40"),
        ("a10g", "a10g"),
        ("a10", "a10"),
        ("l4", "l4"),
        ("t4", "t4"),
        ("p100", "p100"),
        ("v100", "v100-32" if memory_gb > 20 else "v100"),
        ("4090", "rtx4090"),
        ("3090", "rtx3090"),
    ]
    for key, profile in table:
        if re.search(rf"(?<![a-z0-9]){key}(?![a-z0-9])", n):  # whole model numbers: an RTX A4000 is no A40
            return profile
    return "cpu"


def profile_for(name: str, memory_gb: float, capability: tuple[int, int] | None, cpus: int) -> tuple[Profile, str]:
    """The profile of a detected device, and a warning ('' if none): a listed card gets its own;
    an unlisted one gets a profile built from its memory and compute capability, so an H200-class
    card is never treated as a CPU. CPU: the cpu profile."""
    if capability is None:
        return PROFILES["cpu"], ""
    listed = profile_from_gpu_name(name, memory_gb)
    if listed != "cpu":
        return PROFILES[listed], ""
    built = Profile("custom", name, round(memory_gb), capability, cpus, note="built from the detected card")
    cc = "{}.{}".format(*capability)
    return built, (
        f"GPU {name!r} is not in kagtpl's table: using a profile built from it ({memory_gb:.0f} GB, "
        f"compute capability {cc}, {amp_mode(capability)})"
    )


def nearest_profile(memory_gb: float, capability: tuple[int, int]) -> str:
    """The listed GPU profile closest to an unlisted card: the same precision (AMP mode), then
    the nearest memory (what `kagtpl new --gpu auto` records, copier.yml's choices being fixed)."""
    same = [p for p in PROFILES.values() if p.is_gpu and p.gpus == 1 and amp_mode(p.capability) == amp_mode(capability)]
    pool = same or [p for p in PROFILES.values() if p.is_gpu]
    return min(pool, key=lambda p: (abs(p.memory_gb - memory_gb), -p.memory_gb)).name


# The decision matrix (field notes): GPU memory % after the first steps, by model size class.
# Target 70-90% for every model; small models may sit at 50-60%.
TARGET_PCT = {"small": 50.0, "large": 70.0}
BAND_MAX_PCT = 90.0  # keep ~10% free: a batch right at the limit OOMs later (Lightning #21154)
DROP_WARNING_POINTS = 20.0


@dataclass(frozen=True)
class Decision:
    row: str
    action: str
    factor: float  # suggested batch multiplier (1 = keep)
    needed: bool  # action needed (doctor exits 1)
    optional: bool = False


def memory_decision(pct: float, size_class: str) -> Decision:
    """The row of the matrix for a GPU memory percentage and a 'small' / 'large' model."""
    small = size_class == "small"
    if pct < 50:
        # memory is mostly fixed cost (weights, optimizer, CUDA context) at a few %: doubling from
        # 1% takes six tries; the power of two toward 70% takes one (at most x16, then look again)
        factor = max(2, min(16, 2 ** math.floor(math.log2(70 / max(pct, 0.1)))))
        if factor == 2:
            return Decision("< 50%", "double the batch", 2.0, True)
        return Decision("< 50%", f"grow the batch x{factor} toward 70% (then check again)", float(factor), True)
    if pct < 60:
        if small:
            return Decision("50-60%, small model", "proceed (acceptable for a small model)", 1.0, False)
        return Decision("50-60%, large model", "optionally 1.5x the batch", 1.5, False, optional=True)
    if pct < 70:
        if small:
            return Decision("60-70%, small model", "proceed", 1.0, False)
        return Decision("60-70%, large model", "proceed (below the 70% target for a large model)", 1.0, False)
    if pct <= 90:
        return Decision("70-90%", "proceed (optimal)", 1.0, False)
    return Decision("> 90%", "proceed (near the limit)", 1.0, False)


def memory_drop_warning(before_pct: float, after_pct: float) -> str | None:
    """A sharp fall between epochs (76% -> 45%): the batch changed, or one-time buffers were freed."""
    if before_pct - after_pct >= DROP_WARNING_POINTS:
        return (
            f"GPU memory fell from {before_pct:.1f}% to {after_pct:.1f}% between epochs: the batch changed "
            "(an OOM halves the micro-batch) or the first epoch's peak held one-time buffers; not a leak (that rises)"
        )
    return None
