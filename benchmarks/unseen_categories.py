"""A category value the training rows never have: the tabular MLP's code-0 embedding (missing or
unseen) as it starts now (zero) against a random row (torch's N(0, 1) draw, as before 2026-12-04).

    python benchmarks/unseen_categories.py [--seeds 20] [--epochs 30]

Synthetic rows, each seed its own: y ~ Bernoulli(sigmoid(1.5 x0 - x1 + effect[shop])), shops a-d
with effects -1, -0.3, 0.3, 1 (their mean 0). The generated train.py's own Preprocessor and
TabularMLP train on 2,000 rows of shops a-d (no missing shop, so nothing trains code 0) and are
scored by logloss on 1,000 rows of an unseen shop, whose true effect is the mean, 0. Both starts
use the same torch seed; only code 0's row differs.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
import torch
from _project import rendered

EFFECTS = {"a": -1.0, "b": -0.3, "c": 0.3, "d": 1.0}


def rows(n: int, shops: list[str], rng: np.random.Generator) -> tuple[pd.DataFrame, np.ndarray]:
    x = rng.normal(size=(n, 4))
    shop = rng.choice(shops, n)
    logit = 1.5 * x[:, 0] - x[:, 1] + np.array([EFFECTS.get(s, 0.0) for s in shop])
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    frame = pd.DataFrame(x, columns=[f"x{i}" for i in range(4)])
    frame["shop"] = shop
    return frame, y


def unseen_logloss(train, seed: int, start: str, epochs: int) -> float:
    """One MLP trained from `start` ("zero" or "random" code 0): its logloss on the unseen shop."""
    rng = np.random.default_rng(seed)
    (fit, y), (unseen, truth) = rows(2000, list(EFFECTS), rng), rows(1000, ["z"], rng)
    pre = train.Preprocessor.fit(fit, list(fit.columns))
    torch.manual_seed(seed)
    model = train.TabularMLP(4, pre.cardinalities, 1, [64, 64], 0.1)
    if start == "random":  # the row as torch draws it: what an untrained code 0 held before
        with torch.no_grad():
            for emb in model.embeddings:
                emb.weight[0].normal_()
    x_num, x_cat = map(torch.from_numpy, pre.transform(fit))
    target, opt = torch.from_numpy(y), torch.optim.AdamW(model.parameters(), 3e-3)
    for _ in range(epochs):
        for batch in torch.randperm(len(fit)).split(128):
            opt.zero_grad()
            out = model(x_num[batch], x_cat[batch]).squeeze(1)
            torch.nn.functional.binary_cross_entropy_with_logits(out, target[batch]).backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        p = torch.sigmoid(model(*map(torch.from_numpy, pre.transform(unseen))).squeeze(1)).numpy()
    p = p.clip(1e-6, 1 - 1e-6)
    return float(-np.mean(truth * np.log(p) + (1 - truth) * np.log(1 - p)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--epochs", type=int, default=30)
    args = p.parse_args()
    train = rendered("tabular", problem="binary").train
    scores = {s: [unseen_logloss(train, k, s, args.epochs) for k in range(args.seeds)] for s in ("random", "zero")}
    print(f"{'code 0':8s} {'mean':>7s} {'sd':>7s} {'worst':>7s}   (logloss on the unseen shop, {args.seeds} seeds)")
    for start, v in scores.items():
        print(f"{start:8s} {np.mean(v):7.4f} {np.std(v):7.4f} {np.max(v):7.4f}")
    gain = np.array(scores["random"]) - np.array(scores["zero"])
    print(f"zero better in {np.mean(gain > 0):.0%} of the seeds, by {gain.mean():.4f} on average")


if __name__ == "__main__":
    main()
