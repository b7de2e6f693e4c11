"""Input pipeline headroom: images/s the generated image project's loader delivers from its decode
cache with Kaggle's 3 workers at 224 px, as uint8 batches (normalised later, on the device) vs
the former float32 path (A.Normalize on the CPU, 4x the bytes through shared memory), side by
side; then set against published GPU training rates the loader has to keep up with.

    python benchmarks/input_headroom.py [--images 768] [--batch 64] [--workers 3]

Reference rates (timm's results/benchmark-train-amp-nchw-pt112-cu113-rtx3090.csv, AMP, NCHW,
224 px: resnet50 826 samples/s at batch 512, efficientnet_b0 1459 samples/s at batch 384). timm
publishes no T4 table; a T4 trains slower than an RTX 3090, so these are upper bounds of what a
Kaggle T4 can consume.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")  # before its import: no network call for its version

import albumentations as A  # noqa: E402
import numpy as np  # noqa: E402
from _project import rendered  # noqa: E402
from albumentations.pytorch import ToTensorV2  # noqa: E402

TIMM_RTX3090_TRAIN = {"resnet50": 826.06, "efficientnet_b0": 1459.11}  # samples/s, see the docstring


def epoch_rate(loader, epochs: int = 2) -> float:
    """Images/s of the last of `epochs` full passes (the first pays worker start-up)."""
    rate = 0.0
    for _ in range(epochs):
        t0, n = time.perf_counter(), 0
        for x, _ in loader:
            n += len(x)
        rate = n / (time.perf_counter() - t0)
    return rate


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--images", type=int, default=768)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--workers", type=int, default=3)  # Kaggle's 4 vCPUs - 1
    p.add_argument("--size", type=int, default=224)
    args = p.parse_args()
    project = rendered("image", model="resnet18", image_size=args.size)
    train, hardware = project.train, project.hardware
    rng = np.random.default_rng(0)
    cache = rng.integers(0, 255, (args.images, args.size, args.size, 3), dtype=np.uint8)  # the decode cache's layout
    targets = rng.integers(0, 10, args.images)
    loader_cfg = hardware.loader_settings(args.workers + 1, False)
    uint8_tf = train.make_transforms(args.size, True, True)  # the project's: augment, then CHW uint8
    float_tf = A.Compose([*uint8_tf.transforms[:-1], A.Normalize(), ToTensorV2()])  # the former: float32 on the CPU

    def loader(tf):
        return train.make_loader(
            train.ImageDataset(cache, np.arange(args.images), targets, tf), args.batch, True, loader_cfg
        )

    uint8_rate, float_rate = epoch_rate(loader(uint8_tf)), epoch_rate(loader(float_tf))
    print(
        f"input headroom: {args.images} cached images at {args.size} px, batch {args.batch}, "
        f"{loader_cfg['num_workers']} workers, the project's augmentations; epoch 2"
    )
    print(f"{'':34}{'images/s':>10}{'bytes/image':>13}")
    print(f"{'uint8 batches (kagtpl)':34}{uint8_rate:10.1f}{3 * args.size**2:13d}")
    print(f"{'float32 batches (normalised on CPU)':34}{float_rate:10.1f}{4 * 3 * args.size**2:13d}")
    print(f"ratio uint8 / float32: {uint8_rate / float_rate:.2f}x")
    for model, rate in TIMM_RTX3090_TRAIN.items():
        print(f"vs {model} training on an RTX 3090 (timm, AMP): {rate:.0f}/s -> loader covers {uint8_rate / rate:.2f}x")


if __name__ == "__main__":
    main()
