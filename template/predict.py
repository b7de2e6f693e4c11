"""Ensemble every model_fold*.pth in --out-dir into a checked submission.csv.

Any number of folds works: a run killed after fold 1 still gives a submission from fold 0
and fold 1. A corrupt checkpoint is skipped with a warning; no checkpoint at all is an error.

    python predict.py                  # GPU if there is one
    python predict.py --device cpu
    python predict.py --no-tta         # one view instead of image + horizontal flip
"""

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import hardware
import kit
from train import DATA_DIR, OUT_DIR, ImageDataset, build_model, image_path, make_loader, make_transforms, predict_probs


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=DATA_DIR, help="competition folder with the test images")
    p.add_argument("--out-dir", default=OUT_DIR, help="where train.py wrote model_fold*.pth; submission goes here")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--batch-size", type=int, default=0, help="0 = twice the training batch (no gradients kept)")
    p.add_argument("--workers", type=int, default=-1, help="-1 = min(12, usable CPUs - 1)")
    p.add_argument(
        "--tta",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="average with a horizontal flip (only if training used --hflip)",
    )
    p.add_argument("--submission", default="submission.csv", help="file name inside --out-dir")
    return p.parse_args(argv)


def main(argv=None):
    args = get_args(argv)
    out, data = Path(args.out_dir), Path(args.data_dir)
    checkpoints = kit.fold_checkpoints(out)
    if not checkpoints:
        sys.exit(f"ERROR: no loadable model_fold*.pth in {out}: run train.py first (nothing was written)")
    print(
        f"ENSEMBLE: {len(checkpoints)} checkpoint(s), folds {[c.get('fold') for _, c in checkpoints]}: "
        f"{', '.join(p.name for p, _ in checkpoints)}"
    )
    if any(c["config"].get("dry_run") for _, c in checkpoints):
        print("WARNING: dry-run checkpoints (3 batches of training): fine for a smoke test, not for a score")

    config = checkpoints[0][1]["config"]
    sample = pd.read_csv(data / config["sample_submission"], dtype={0: str})
    id_col = sample.columns[0]
    sample[id_col] = sample[id_col].astype(str)
    paths = [image_path(data / config["test_dir"], i, config["image_ext"]) for i in sample[id_col]]
    names = [f"{config['sample_submission']} line {i + 2}" for i in range(len(paths))]
    prob_columns = len(sample.columns) > 2 or sample.columns[1] != config["label_col"]

    device = kit.resolve_device(args.device)
    cpus = hardware.usable_cpus()
    loader = hardware.loader_settings(cpus if args.workers < 0 else args.workers + 1, device.type == "cuda")
    amp = kit.Amp(hardware.amp_mode(kit.describe_gpu(device)[2]), device)
    all_probs = []
    for path, ckpt in checkpoints:
        cfg, classes = ckpt["config"], ckpt["classes"]
        try:
            images = kit.image_cache(paths, names, cfg["image_size"], out / "cache", "test", loader["num_workers"])
        except kit.DataError as e:
            sys.exit(f"PREFLIGHT ERROR: {e}")
        model = build_model(cfg, len(classes)).to(device)
        model.load_state_dict(ckpt["model"])
        channels_last = device.type == "cuda" and cfg.get("channels_last", False)
        run = {"device": device, "channels_last": channels_last}
        ds = ImageDataset(images, np.arange(len(paths)), np.zeros(len(paths), int), make_transforms(0, False, False))
        dl = make_loader(ds, args.batch_size or 2 * cfg["batch_size"], False, loader)
        probs = predict_probs(model, dl, amp, run, tta_flip=args.tta and cfg.get("hflip", False))
        order = [classes.index(c) for c in (sample.columns[1:] if prob_columns else classes)]
        all_probs.append(probs[:, order])
        print(f"PREDICT: {path.name} -> {len(probs)} rows")
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()

    probs = kit.ensemble(all_probs)
    sub = sample.copy()
    if prob_columns:
        sub[list(sample.columns[1:])] = probs
    else:
        sub[sample.columns[1]] = [checkpoints[0][1]["classes"][k] for k in probs.argmax(1)]
    try:
        kit.check_submission(sub, sample, prob_columns)
    except ValueError as e:
        sys.exit(f"ERROR: submission failed its check, not written: {e}")
    target = out / args.submission
    kit.write_csv_atomic(sub, target)
    print(f"SUBMISSION: {target} ({len(sub)} rows, {len(all_probs)} fold(s) ensembled)")


if __name__ == "__main__":
    main()
