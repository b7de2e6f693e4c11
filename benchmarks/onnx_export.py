"""An audio fold's export to ONNX Runtime, by each of torch's two exporters, side by side: what
predict.py pays on CPU for every fold before its first window (`--export auto`).

    python benchmarks/onnx_export.py [--models resnet10t,efficientnet_b0] [--mels 64] [--repeats 2]

For each model (built from scratch, on a spectrogram of `--mels` x 157 frames: 5 s at the default
hop), each exporter's seconds, the fastest of `--repeats` exports (the first of a process pays
its imports too), the largest difference from torch, and the ratio torch.export / TorchScript.
`machinery/onnx_export.py` of a freshly rendered audio project is what runs, with its own checks
(two batch sizes, 1e-3), on one thread as predict.py has on a 2-core machine.
"""

from __future__ import annotations

import argparse
import time
import warnings

from _project import import_project, render, work_dir


def timed_export(onnx_export, net, example, exporter: str) -> tuple[float, float]:
    """One export and its check, as onnx_net makes them: (seconds, largest difference from torch)."""
    start = time.perf_counter()
    session = onnx_export.OrtNet(onnx_export.session_for(onnx_export.onnx_bytes(net, example, exporter), 1))
    seconds = time.perf_counter() - start
    return seconds, onnx_export.largest_difference(net, session, example)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="resnet10t,efficientnet_b0", help="timm models, comma-separated")
    p.add_argument("--mels", type=int, default=64, help="the spectrogram's height (the CPU profile's 64)")
    p.add_argument("--repeats", type=int, default=2, help="exports per model and exporter; the fastest counts")
    args = p.parse_args()
    warnings.simplefilter("ignore")
    project = render(work_dir("kagtpl-bench-onnx-") / "proj", "audio")
    onnx_export = import_project(project, ("onnx_export",)).onnx_export
    import timm
    import torch

    torch.set_num_threads(1)
    print(f"{'model':<18} {'exporter':<13} {'seconds':>8} {'difference':>11}")
    for name in args.models.split(","):
        net = timm.create_model(name, pretrained=False, num_classes=8, in_chans=1).eval()
        example = torch.randn(2, 1, args.mels, 157, generator=torch.Generator().manual_seed(0))
        best = {}
        for exporter in onnx_export.EXPORTERS:
            runs = [timed_export(onnx_export, net, example, exporter) for _ in range(args.repeats)]
            best[exporter] = min(s for s, _ in runs)
            print(f"{name:<18} {exporter:<13} {best[exporter]:>8.2f} {max(d for _, d in runs):>11.1e}")
        print(f"{name}: torch.export / TorchScript seconds: {best['torch.export'] / best['TorchScript']:.1f}")


if __name__ == "__main__":
    main()
