"""Image input pipeline: epoch-2 images/s reading the generated project's decode cache against
decoding the JPEGs with PIL every epoch, with the same transforms, batch and workers.

    python benchmarks/image_pipeline.py [--images 600] [--jpeg-size 400] [--size 128]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import torch
from _project import rendered, work_dir
from PIL import Image

warnings.filterwarnings("ignore")


class PilImages(torch.utils.data.Dataset):
    """The usual Kaggle notebook dataset: open, decode and resize the JPEG on every access."""

    def __init__(self, paths, targets, size, transform):
        self.paths, self.targets, self.size, self.transform = paths, targets, size, transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        img = Image.open(self.paths[i]).convert("RGB").resize((self.size, self.size), Image.Resampling.BILINEAR)
        return self.transform(image=np.asarray(img))["image"], int(self.targets[i])


def epoch_rate(loader) -> float:
    for _ in loader:  # epoch 1: worker start-up, page cache
        pass
    t0, n = time.perf_counter(), 0
    for x, _ in loader:
        n += len(x)
    return n / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--images", type=int, default=600)
    p.add_argument("--jpeg-size", type=int, default=400)
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()
    project = rendered("image", model="resnet18", image_size=args.size)
    train, images, hardware = project.train, project.images, project.hardware
    tmp = work_dir("kagtpl-bench-jpeg-")
    rng = np.random.default_rng(0)
    paths = []
    for i in range(args.images):  # photo-like: smooth gradients plus noise, JPEG quality 90
        base = np.linspace(0, 255, args.jpeg_size)[None, :, None] * rng.random((1, 1, 3))
        noise = rng.normal(0, 25, (args.jpeg_size, args.jpeg_size, 3))
        img = np.clip(base + noise, 0, 255).astype(np.uint8)
        path = tmp / f"{i:05d}.jpg"
        Image.fromarray(img).save(path, quality=90)
        paths.append(str(path))
    targets = rng.integers(0, 10, args.images)
    loader_cfg = hardware.loader_settings(hardware.usable_cpus(), False)
    tf = train.make_transforms(args.size, True, True)

    t0 = time.perf_counter()
    cache = images.image_cache(paths, paths, args.size, tmp / "cache", "bench", loader_cfg["num_workers"])
    build = time.perf_counter() - t0
    cached = train.make_loader(
        train.ImageDataset(cache, np.arange(len(paths)), targets, tf), args.batch, True, loader_cfg
    )
    pil = train.make_loader(PilImages(paths, targets, args.size, tf), args.batch, True, loader_cfg)
    rate_cache, rate_pil = epoch_rate(cached), epoch_rate(pil)
    print(
        f"image input pipeline, {args.images} JPEGs of {args.jpeg_size}px -> {args.size}px, batch {args.batch}, "
        f"{loader_cfg['num_workers']} workers, same albumentations transforms; epoch 2"
    )
    print(f"{'':34}{'images/s':>10}")
    print(f"{'decode cache (kagtpl)':34}{rate_cache:10.1f}")
    print(f"{'PIL decode every epoch':34}{rate_pil:10.1f}")
    print(f"ratio: {rate_cache / rate_pil:.2f}x (the cache was built once in {build:.1f}s)")


if __name__ == "__main__":
    main()
