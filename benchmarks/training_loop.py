"""Training-loop efficiency: the generated image train.py's loop against a bare hand-written
PyTorch loop and a PyTorch Lightning Trainer doing the same work (same model, data pipeline,
batch, optimizer, LR schedule and precision). Steady state: the second epoch of each run,
interleaved rounds, best of rounds.

    python benchmarks/training_loop.py [--images 512] [--size 64] [--batch 32] [--rounds 3]

Lightning comes with the bench extra: pip install -e '.[bench]' (skipped if missing).
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import numpy as np
import torch
from _project import rendered

warnings.filterwarnings("ignore")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--size", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    project = rendered("image", model="resnet18", image_size=args.size)
    train, engine, hardware, steps = project.train, project.engine, project.hardware, project.steps
    # every core, unless OMP_NUM_THREADS says otherwise (the tests give each pytest worker its share: two
    # workers' 2 threads on 2 cores spin against each other in OpenMP's waits)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or max(1, hardware.usable_cpus())))
    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (args.images, args.size, args.size, 3), dtype=np.uint8)  # the decode cache's layout
    targets = rng.integers(0, 10, args.images)
    dataset = train.ImageDataset(images, np.arange(args.images), targets, train.make_transforms(args.size, True, True))
    loader_cfg = hardware.loader_settings(hardware.usable_cpus(), False)
    device = torch.device("cpu")

    def fresh(fused: bool = True):
        torch.manual_seed(0)
        model = train.build_model({"model": "resnet18"}, 10)
        # fused: machinery.steps.make_optimizer's AdamW; unfused: PyTorch's default on CPU (tensor by tensor)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=fused)
        return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)

    def ours(hooks: bool):
        model, opt, sched = fresh()
        loader = train.make_loader(dataset, args.batch, True, loader_cfg)
        machine = engine.make_machine(device, "off", loader_cfg, channels_last=False)
        batching = engine.Batching(args.batch, 1, 1e-3)
        planner = project.planner.TimePlanner(None, 1, 2)

        def batch_loss(batch):  # what cross_validate gives run_epoch: the Competition's loss, on the device
            x, y = steps.to_device(batch, machine)
            return train.loss_fn(model(train.normalize(x)), y), len(y)

        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            model.train()
            stop = planner.tick if hooks else None
            steps.run_epoch(loader, len(loader), batch_loss, opt, sched, machine.amp, batching, None, stop)
            times.append(time.perf_counter() - t0)
        return times[-1]

    def bare(fused: bool = True):
        model, opt, sched = fresh(fused)
        loader = train.make_loader(dataset, args.batch, True, loader_cfg)
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            model.train()
            for x, y in loader:
                opt.zero_grad(set_to_none=True)
                loss = torch.nn.functional.cross_entropy(model(train.normalize(x)), y)
                loss.backward()
                opt.step()
                sched.step()
            times.append(time.perf_counter() - t0)
        return times[-1]

    def lightning():
        try:
            import pytorch_lightning as pl
        except ImportError:
            return None
        model, opt, sched = fresh()
        loader = train.make_loader(dataset, args.batch, True, loader_cfg)

        class Module(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.model = model

            def training_step(self, batch, i):
                x, y = batch
                return torch.nn.functional.cross_entropy(self.model(train.normalize(x)), y)

            def configure_optimizers(self):
                return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

        class EpochTimer(pl.Callback):
            def __init__(self):
                self.times, self.t0 = [], 0.0

            def on_train_epoch_start(self, trainer, module):
                self.t0 = time.perf_counter()

            def on_train_epoch_end(self, trainer, module):
                self.times.append(time.perf_counter() - self.t0)

        timer = EpochTimer()
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=1,
            max_epochs=2,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[timer],
        )
        trainer.fit(Module(), loader)
        return timer.times[-1]

    contenders = {
        "kagtpl train.py loop": lambda: ours(True),
        "kagtpl loop, no hooks": lambda: ours(False),
        "bare PyTorch loop": bare,
        "bare loop, AdamW unfused": lambda: bare(False),
        "Lightning Trainer": lightning,
    }
    best = {name: float("inf") for name in contenders}
    for _ in range(args.rounds):
        for name, fn in contenders.items():
            t = fn()
            best[name] = min(best[name], t) if t is not None else None
    n = (args.images // args.batch) * args.batch
    print(
        f"training loop, resnet18 {args.size}px, {n} images/epoch, batch {args.batch}, AdamW (fused), fp32, CPU, "
        f"{loader_cfg['num_workers']} workers, torch {torch.__version__}; epoch 2, best of {args.rounds}"
    )
    print(f"{'':26}{'samples/s':>12}{'vs bare loop':>14}")
    for name, t in best.items():
        if t is None:
            print(f"{name:26}{'(not installed: pip install -e .[bench])':>40}")
            continue
        print(f"{name:26}{n / t:12.1f}{best['bare PyTorch loop'] / t:13.3f}x")
    if best["Lightning Trainer"]:
        print(f"kagtpl / Lightning: {best['Lightning Trainer'] / best['kagtpl train.py loop']:.3f}x")


if __name__ == "__main__":
    main()
