"""A fresh process's start, step by step: what predict.py pays after run.py's `go` when nothing is
imported or initialised yet (the imports, CUDA's context, cuBLAS and cuDNN, a timm model's build
and its first forward passes).

    python benchmarks/cuda_start.py [--model efficientnet_b0] [--device cuda]

One line of `step=seconds` and the total; run it a few times (the first pays the disk). On CPU
the CUDA steps are left out. On the sixth lent card (an H200 machine) CUDA's own steps took
1.0-1.4 s in all and `import torch` and `import timm` 3.6-5.3 s and 4.9-7.0 s, against 1.4-1.5 s
and 1.6-1.7 s on the 2-core machine kagtpl is built on (docs/gpu-check.md, the sixth run).
"""

from __future__ import annotations

import argparse
import time

T0 = time.time()
STEPS: list[tuple[str, float]] = []


def mark(name: str, cuda: bool) -> None:
    """The step's seconds since the last mark, CUDA's queue drained first."""
    if cuda:
        import torch

        torch.cuda.synchronize()
    STEPS.append((name, time.time()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="efficientnet_b0", help="a timm model, built from scratch")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = p.parse_args()
    cuda = args.device == "cuda"
    STEPS.append(("start", time.time()))
    import torch

    mark("import torch", False)
    import timm

    mark("import timm", False)
    if cuda:
        torch.cuda.init()
        mark("cuda.init", False)
        torch.zeros(1, device="cuda")
        mark("context", cuda)
    a = torch.randn(512, 512, device=args.device)
    (a @ a).sum().item()
    mark("first matmul", cuda)
    conv = torch.nn.Conv2d(3, 16, 3).to(args.device)
    conv(torch.randn(2, 3, 64, 64, device=args.device)).sum().item()
    mark("first conv", cuda)
    model = timm.create_model(args.model, pretrained=False, num_classes=5)
    mark("model build", False)
    model = model.to(args.device).eval()
    mark("model to device", cuda)
    dtype = torch.bfloat16 if cuda else torch.float32
    with torch.no_grad(), torch.autocast(args.device, dtype=dtype, enabled=cuda):
        for name, batch in (("first forward", 16), ("second forward", 16), ("new batch size", 32)):
            model(torch.randn(batch, 3, 128, 128, device=args.device)).float().sum().item()
            mark(name, cuda)
    steps = " ".join(f"{name}={t - STEPS[i][1]:.2f}s" for i, (name, t) in enumerate(STEPS[1:]))
    print(f"{steps} total={STEPS[-1][1] - T0:.2f}s")


if __name__ == "__main__":
    main()
