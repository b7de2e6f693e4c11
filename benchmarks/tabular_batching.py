"""Tabular batching: the generated project's in-memory permutation slicing against
DataLoader(TensorDataset), at batch 4096, in batches/s and for a whole MLP epoch.

    python benchmarks/tabular_batching.py [--rows 200000]

Both sides measured in this one run, on the same tensors; the ratio is what matters.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch
from _project import rendered

warnings.filterwarnings("ignore")


def timed(fn, repeat: int = 3) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--batch", type=int, default=4096)
    args = p.parse_args()
    project = rendered("tabular", problem="binary", metric="auc")
    train, engine = project.train, project.engine
    torch.manual_seed(0)
    n, b = args.rows, args.batch
    x_num, x_cat, y = torch.randn(n, 40), torch.randint(0, 20, (n, 5)), torch.randint(0, 2, (n,))
    device = torch.device("cpu")

    def slice_batches():  # the generated project's in-memory batches
        return iter(engine.TensorBatches((x_num.to(device), x_cat.to(device), y.to(device)), b, True, True))

    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x_num, x_cat, y), batch_size=b, shuffle=True, drop_last=True
    )
    n_batches = n // b

    def drain(make):
        return lambda: sum(1 for _ in make())

    t_slice, t_loader = timed(drain(slice_batches)), timed(drain(lambda: iter(loader)))

    model = train.TabularMLP(40, [21] * 5, 1, [512, 256], 0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def epoch(make):
        def run():
            model.train()
            for xn, xc, yy in make():
                loss = torch.nn.functional.binary_cross_entropy_with_logits(model(xn, xc).squeeze(1), yy.float())
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

        return run

    e_slice, e_loader = timed(epoch(slice_batches), repeat=2), timed(epoch(lambda: iter(loader)), repeat=2)
    print(f"tabular batching, {n:,} rows x 45 columns, batch {b}, {n_batches} batches, torch {torch.__version__}, CPU")
    print(f"{'':38}{'slices (kagtpl)':>18}{'DataLoader':>14}{'ratio':>8}")
    print(
        f"{'batching only, batches/s':38}{n_batches / t_slice:18.1f}{n_batches / t_loader:14.1f}"
        f"{t_loader / t_slice:7.1f}x"
    )
    print(f"{'MLP epoch (fwd+bwd+step), s':38}{e_slice:18.2f}{e_loader:14.2f}{e_loader / e_slice:7.2f}x")
    print(f"{'MLP epoch, batches/min':38}{60 * n_batches / e_slice:18.0f}{60 * n_batches / e_loader:14.0f}")


if __name__ == "__main__":
    main()
