"""kagtpl machinery: resource prints, GPU memory monitor, AMP, decode cache, checkpoint I/O,
ensembling and submission checks.

This file belongs to the template: `copier update` improves it, so keep your competition
code (data, model, loss) in train.py and predict.py. Log formats printed here are an
interface that people and agents parse; they are documented in kagtpl's docs/log-format.md.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import signal
import socket
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

import hardware

GB = 1024**3
PROCESS_START = time.time()  # wall clock at import: the budget counts from here unless told otherwise


class DataError(Exception):
    """Bad competition data: the message names the file and row at fault."""


# ----------------------------------------------------------------------------- environment


def on_kaggle() -> bool:
    return "KAGGLE_KERNEL_RUN_TYPE" in os.environ


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda asked for, but torch sees no CUDA GPU (try --device cpu)")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    np.random.seed(seed)
    torch.manual_seed(seed)


def describe_gpu(device: torch.device) -> tuple[str, float, tuple[int, int] | None]:
    """(name, total GB, compute capability); ('none', 0.0, None) on CPU."""
    if device.type != "cuda":
        return "none", 0.0, None
    props = torch.cuda.get_device_properties(device)
    return props.name, props.total_memory / GB, (props.major, props.minor)


# ----------------------------------------------------------------------------- precision


class Amp:
    """Autocast + GradScaler for one mode from hardware.amp_mode(): bf16 (no scaler),
    fp16 (with GradScaler), fp32/off (plain). The whole loop calls only these methods."""

    def __init__(self, mode: str, device: torch.device):
        self.mode = mode
        self.enabled = mode in ("bf16", "fp16")
        self.device_type = device.type
        self.dtype = torch.bfloat16 if mode == "bf16" else torch.float16
        self.scaler = torch.amp.GradScaler(device.type, enabled=mode == "fp16")

    def autocast(self):
        if not self.enabled:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        self.scaler.step(optimizer)
        self.scaler.update()


# ----------------------------------------------------------------------------- GPU memory


class GpuMonitor:
    """Peak GPU memory of a window (a step or an epoch).

    Seam for tests: `reader()` returns (peak_bytes_since_reset, total_bytes) and `reset()`
    starts a new window. On CUDA they wrap torch.cuda.max_memory_allocated and
    reset_peak_memory_stats; on CPU there is no reader and every figure prints as 'none'.
    We report the *peak*: memory_allocated() after backward has already freed the
    activations and under-reports the real need several-fold.
    """

    def __init__(self, device: torch.device, reader=None, reset=None):
        if reader is None and device.type == "cuda":
            total = torch.cuda.get_device_properties(device).total_memory
            reader = lambda: (torch.cuda.max_memory_allocated(device), total)  # noqa: E731
            reset = lambda: torch.cuda.reset_peak_memory_stats(device)  # noqa: E731
        self._reader, self._reset = reader, reset

    def reset(self) -> None:
        if self._reset is not None:
            self._reset()

    def peak(self) -> tuple[float, float, float] | None:
        """(used GB, total GB, percent) of the current window, or None without a GPU."""
        if self._reader is None:
            return None
        used, total = self._reader()
        return used / GB, total / GB, 100.0 * used / total

    def field(self) -> str:
        """The GPU= field of the epoch line: '18.31GB (76.3%)' or 'none'."""
        p = self.peak()
        return "none" if p is None else f"{p[0]:.2f}GB ({p[2]:.1f}%)"


# ----------------------------------------------------------------------------- log lines


def resource_lines(cpus: int, batch: int, gpu_name: str, amp: Amp, total_gb: float, loader: dict) -> list[str]:
    return [
        f"RESOURCES: {cpus} CPU cores, batch={batch}, GPU={gpu_name}, Mixed Precision={'ON' if amp.enabled else 'OFF'}",
        f"GPU Memory: {total_gb:.1f} GB" if gpu_name != "none" else "GPU Memory: none",
        f"DataLoader: num_workers={loader['num_workers']}, prefetch_factor={loader['prefetch_factor']}, "
        f"persistent_workers={loader['persistent_workers']}" + (f" ({loader['note']})" if loader.get("note") else ""),
    ]


def model_line(name: str, model: torch.nn.Module) -> str:
    params_m = sum(p.numel() for p in model.parameters()) / 1e6
    return f"Model: {name} ({params_m:.1f}M params, {hardware.size_class(name, params_m)} model)"


def memory_used_lines(monitor: GpuMonitor, batch: int) -> list[str]:
    p = monitor.peak()
    if p is None:
        return ["GPU Memory Used: none (CPU run)", f"VALIDATION: CPU run, no GPU memory to check (batch_size={batch})"]
    return [
        f"GPU Memory Used: {p[0]:.2f} GB / {p[1]:.1f} GB ({p[2]:.1f}%)",
        f"VALIDATION: If <50% memory, batch_size={batch} is TOO SMALL - should be {2 * batch}+",
    ]


def memory_drop_line(before: tuple | None, after: tuple | None) -> str | None:
    """A WARNING line when GPU memory % falls sharply between epochs (76% -> 45%)."""
    if before is None or after is None:
        return None
    text = hardware.memory_drop_warning(before[2], after[2])
    return f"WARNING: {text}" if text else None


def epoch_line(epoch: int, stats: dict, metric_name: str, monitor: GpuMonitor) -> str:
    return (
        f"Epoch {epoch}: Loss={stats['train_loss']:.4f}, ValLoss={stats['val_loss']:.4f}, "
        f"{metric_name}={stats['metric']:.4f}, LR={stats['lr']:.2e}, Time={stats['time_s']:.1f}s, "
        f"Throughput={stats['samples_per_s']:.0f} samples/s, GPU={monitor.field()}"
    )


class JsonLog:
    """One JSON object per line in out_dir/train_log.jsonl, for agents and plots; this run's
    records are also kept in `records` (the report picture is drawn from them)."""

    def __init__(self, path: Path):
        self.path, self.records = path, []

    def write(self, **record) -> None:
        self.records.append(record)
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def write_report(records: list[dict], path: Path, model: str, device: torch.device) -> None:
    """The run's picture (report.py): loss, metric and GPU memory % per epoch per fold."""
    if not records:
        return
    where = describe_gpu(device)[0] if device.type == "cuda" else "CPU"
    try:
        import report

        print(f"REPORT: {report.plot(records, path, f'{model} on {where}')}")
    except ImportError as e:  # matplotlib is optional for training itself
        print(f"WARNING: no report picture ({e}); pip install matplotlib")


# ----------------------------------------------------------------------------- training loop


def run_epoch(
    batches, n, batch_loss, optimizer, scheduler, amp, accum, on_first_step=None, should_stop=None, micro=None
):
    """One training pass over the first `n` of `batches` with gradient accumulation.

    `batch_loss(batch)` is the competition code: it returns (mean loss, rows) under autocast.
    Each accumulation group's loss is divided by the group's own size, so a last partial group
    steps the optimizer too, with a correctly scaled gradient. On a CUDA out-of-memory error the
    batch is redone as 2 (then 4, ...) micro-batches: the micro-batch halves, the accumulation
    doubles, the effective batch stays; `micro` ({"parts": 1}) carries that across epochs.
    `on_first_step()` runs once after the first optimizer step (the GPU memory lines);
    `should_stop(i)` is asked after every batch (the time budget's deadline, SIGTERM).
    Returns (mean loss, samples seen).
    """
    micro = micro if micro is not None else {"parts": 1}
    total, seen = None, 0
    optimizer.zero_grad(set_to_none=True)
    for i, batch in enumerate(batches):
        if i >= n:
            break
        group = min(accum, n - (i // accum) * accum)
        while True:
            try:
                loss, size = _backward(batch, batch_loss, amp, group, micro["parts"])
                break
            except torch.OutOfMemoryError:
                optimizer.zero_grad(set_to_none=True)  # the group's partial gradients are dropped
                free_gpu_memory()
                rows, parts = batch_rows(batch), micro["parts"]
                if parts * 2 > rows:
                    raise
                micro["parts"] = parts * 2
                print(
                    f"OOM: batch of {rows} did not fit at step {i}: micro-batch {-(-rows // parts)} -> "
                    f"{-(-rows // (2 * parts))}, accumulation {accum * parts} -> {accum * parts * 2}, "
                    f"effective batch {rows * accum} unchanged",
                    flush=True,
                )
        if (i + 1) % accum == 0 or i + 1 == n:
            amp.step(optimizer)
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            if on_first_step is not None:
                on_first_step()
                on_first_step = None
        total = loss * size if total is None else total + loss * size  # on the device: no .item() sync
        seen += size
        if should_stop is not None and should_stop(i):
            break
    return (0.0 if total is None else (total / max(seen, 1)).item()), seen


def batch_rows(batch) -> int:
    return len(batch) if isinstance(batch, torch.Tensor) else batch_rows(batch[0])


def split_batch(batch, parts: int) -> list:
    """A batch (a tensor, or a tuple/list of them) cut into `parts` pieces along the rows."""
    if isinstance(batch, torch.Tensor):
        return list(torch.tensor_split(batch, parts))
    pieces = [split_batch(b, parts) for b in batch]
    return [type(batch)(p[k] for p in pieces) for k in range(parts)]


def _backward(batch, batch_loss, amp, group: int, parts: int):
    """Backward of one batch, as `parts` micro-batches whose gradients add up to the batch's."""
    rows, loss_sum, size_sum = batch_rows(batch), None, 0
    for piece in split_batch(batch, parts) if parts > 1 else [batch]:
        with amp.autocast():
            loss, size = batch_loss(piece)
        amp.backward(loss * (size / rows) / group)
        part = loss.detach().float() * size
        loss_sum, size_sum = (part if loss_sum is None else loss_sum + part), size_sum + size
    return loss_sum / size_sum, size_sum


def free_gpu_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- batch probe


def probe_batch(step, model, optimizer, amp, batch, accum, size_class, monitor, max_batch, lr, log=print):
    """Grow the batch before the first fold until peak GPU memory reaches the decision matrix's
    target for the model's size class (small 50%, large 70%), never above 90% (a 10% margin:
    a batch found right at the limit OOMs later). x2 first, then x1.5; an OOM steps back.

    `step(b)` runs one real training step at micro-batch b. The weights, the optimizer and the
    GradScaler are restored afterwards: probing does not train the model. Returns
    (batch, accum, lr): below the intended effective batch, accumulation rises and the micro-batch
    is the smallest that keeps the effective batch exactly (96 fits, effective 128 -> 64 x 2);
    at or above it, accumulation is 1 and the LR scales by sqrt(new effective / old) (square-root
    scaling, the rule for Adam-type optimizers).
    """
    target, ceiling = hardware.TARGET_PCT[size_class], hardware.BAND_MAX_PCT
    saved = (copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()), amp.scaler.state_dict())
    total_gb = None

    def trial(b: int) -> float | None:
        nonlocal total_gb
        free_gpu_memory()
        monitor.reset()
        try:
            step(b)
        except torch.OutOfMemoryError:
            optimizer.zero_grad(set_to_none=True)
            free_gpu_memory()
            log(f"PROBE: batch={b} -> out of memory")
            return None
        used, total_gb, pct = monitor.peak()
        verdict = "over the 90% ceiling" if pct > ceiling else "below target" if pct < target else "in band"
        log(f"PROBE: batch={b} -> {used:.2f} GB ({pct:.1f}%) {verdict}")
        return pct

    log(f"BATCH PROBE: {size_class} model, target >= {target:.0f}% of GPU memory, ceiling {ceiling:.0f}%")
    start, pct = batch, trial(batch)
    while (pct is None or pct > ceiling) and batch > 1:
        batch = max(1, batch // 2)
        pct = trial(batch)
    if pct is None:
        raise RuntimeError("not even a batch of 1 fits in GPU memory")
    while pct < target and batch < max_batch:
        for factor in (2.0, 1.5):
            candidate = min(max_batch, hardware.round_batch(batch * factor))
            if candidate <= batch:
                continue
            p = trial(candidate)
            if p is not None and p <= ceiling:
                batch, pct = candidate, p
                break
        else:
            break
    model.load_state_dict(saved[0])
    optimizer.load_state_dict(saved[1])
    if saved[2]:  # an enabled GradScaler (fp16) has state to restore
        amp.scaler.load_state_dict(saved[2])
    optimizer.zero_grad(set_to_none=True)
    effective, best = start * accum, batch
    if batch < effective:  # memory forces a smaller micro-batch: more accumulation, same effective batch
        new_accum = math.ceil(effective / batch)
        batch = math.ceil(effective / new_accum)
    else:
        new_accum = 1
    new_lr = lr * math.sqrt(batch * new_accum / effective) if batch * new_accum > effective else lr
    log(
        f"BATCH PROBE: batch {start} x {accum} -> {batch} x {new_accum} (largest in band {best}: {pct:.1f}% of "
        f"{total_gb:.1f} GB), effective batch {effective} -> {batch * new_accum}, lr {lr:.2e} -> {new_lr:.2e}"
        + (" (sqrt scaling)" if new_lr != lr else "")
    )
    return batch, new_accum, new_lr


def count_slices(n: int, batch: int, drop_last: bool) -> int:
    """Batches in an epoch of n rows; with drop_last a table smaller than a batch still gives one."""
    return n // batch if drop_last and n >= batch else math.ceil(n / batch)


def warmup_cosine(optimizer, steps_per_epoch: int, epochs):
    """Linear warm-up over the first 5% of optimizer steps, then cosine decay to zero.
    `epochs()` is read at every step: when the time plan cuts epochs, the decay ends sooner."""

    def factor(step: int) -> float:
        total = max(1, steps_per_epoch * epochs())
        warmup = max(1, int(total * 0.05))
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def fold_is_done(path: Path, config: dict, same_keys=("folds", "seed", "model")) -> bool:
    """A rerun skips a fold whose checkpoint is complete, not a dry run, and made with the same split."""
    if not Path(path).exists():
        return False
    ckpt = load_checkpoint(path)
    if ckpt is None or not ckpt.get("complete") or ckpt["config"].get("dry_run"):
        return False
    return all(ckpt["config"].get(k) == config.get(k) for k in same_keys)


# ----------------------------------------------------------------------------- files


def atomic_write(path: Path, write_fn) -> None:
    """write_fn(tmp_path) writes the file; it only replaces `path` once complete, so a
    kill at any moment leaves either the old file or the new one, never half of one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write_fn(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def save_checkpoint(path: Path, model: torch.nn.Module, config: dict, classes: list[str], **meta) -> None:
    """state_dict + resolved config + class list: predict.py rebuilds the model from this alone."""
    model = getattr(model, "_orig_mod", model)  # unwrap torch.compile
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    payload = {"model": state, "config": config, "classes": list(classes), **meta}
    atomic_write(path, lambda tmp: torch.save(payload, tmp))


def mark_complete(path: Path) -> bool:
    """Flag a fold's best checkpoint as complete (a rerun then skips the fold)."""
    if not Path(path).exists():
        return False
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    ckpt["complete"] = True
    atomic_write(path, lambda tmp: torch.save(ckpt, tmp))
    return True


def load_checkpoint(path: Path) -> dict | None:
    """The checkpoint, or None (with a warning) when it is corrupt or not ours."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, foreign or tampered file: skip it, keep the others
        print(f"WARNING: skipping {path}: cannot load ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
        return None
    if not isinstance(ckpt, dict) or not {"model", "config", "classes"} <= ckpt.keys():
        print(f"WARNING: skipping {path}: not a kagtpl checkpoint (no model/config/classes)")
        return None
    return ckpt


def fold_checkpoints(out_dir: Path) -> list[tuple[Path, dict]]:
    """Every model_fold*.pth in out_dir that loads, in fold order."""
    found = []
    for path in sorted(Path(out_dir).glob("model_fold*.pth"), key=lambda p: (len(p.name), p.name)):
        ckpt = load_checkpoint(path)
        if ckpt is not None:
            found.append((path, ckpt))
    return found


def checkpoints_or_exit(out_dir: Path) -> list[tuple[Path, dict]]:
    """predict.py's start: every loadable fold checkpoint, announced; none at all is an error."""
    found = fold_checkpoints(out_dir)
    if not found:
        raise SystemExit(f"ERROR: no loadable model_fold*.pth in {out_dir}: run train.py first (nothing was written)")
    names = ", ".join(p.name for p, _ in found)
    print(f"ENSEMBLE: {len(found)} checkpoint(s), folds {[c.get('fold') for _, c in found]}: {names}")
    if any(c["config"].get("dry_run") for _, c in found):
        print("WARNING: dry-run checkpoints (3 batches of training): fine for a smoke test, not for a score")
    return found


def write_submission(sub, sample, kind: str, labels, path: Path, folds: int) -> None:
    """predict.py's end: check against sample_submission, then write atomically (or exit, writing nothing)."""
    try:
        check_submission(sub, sample, kind, labels=labels)
    except ValueError as e:
        raise SystemExit(f"ERROR: submission failed its check, not written: {e}") from None
    write_csv_atomic(sub, path)
    print(f"SUBMISSION: {path} ({len(sub)} rows, {folds} fold(s) ensembled)")


def ensemble(probs: list[np.ndarray]) -> np.ndarray:
    """Mean of the folds' class probabilities, renormalised so every row sums to 1."""
    mean = np.mean(np.stack(probs), axis=0).astype(np.float64)
    return mean / mean.sum(axis=1, keepdims=True)


def check_submission(sub, sample, kind: str, labels=None) -> None:
    """Raise ValueError unless `sub` matches sample_submission: columns, ids and their order,
    row count, and values. kind: 'distribution' (probability columns whose rows sum to 1),
    'probability' (each value in [0, 1]), 'label' (each value one of `labels`), 'number' (finite)."""
    if list(sub.columns) != list(sample.columns):
        raise ValueError(f"submission columns {list(sub.columns)[:5]}... differ from sample_submission's")
    if len(sub) != len(sample):
        raise ValueError(f"submission has {len(sub)} rows, sample_submission has {len(sample)}")
    id_col = sample.columns[0]
    bad = np.flatnonzero(sub[id_col].astype(str).to_numpy() != sample[id_col].astype(str).to_numpy())
    if len(bad):
        raise ValueError(f"submission row {bad[0]}: id {sub[id_col].iloc[bad[0]]!r} != {sample[id_col].iloc[bad[0]]!r}")
    values = sub[sample.columns[1:]]
    if kind == "label":
        allowed = {str(v) for v in labels}
        wrong = [v for v in values.to_numpy().ravel() if str(v) not in allowed]
        if wrong:
            raise ValueError(f"submission label {wrong[0]!r} is not a class")
        return
    numbers = values.to_numpy(dtype=np.float64)
    if not np.isfinite(numbers).all():
        raise ValueError("submission values must be finite")
    if kind in ("distribution", "probability") and (numbers.min() < 0 or numbers.max() > 1):
        raise ValueError("submission probabilities must be finite and within [0, 1]")
    if kind == "distribution" and not np.allclose(numbers.sum(axis=1), 1.0, atol=1e-4):
        raise ValueError("submission probabilities of a row must sum to 1")


def write_csv_atomic(df, path: Path) -> None:
    atomic_write(path, lambda tmp: df.to_csv(tmp, index=False))


# ----------------------------------------------------------------------------- images


def read_image(path: str, size: int) -> np.ndarray | None:
    """RGB uint8 (size, size, 3), or None when the file is missing or cannot be decoded."""
    import cv2

    img = cv2.imread(path, cv2.IMREAD_COLOR)
    if img is None:
        return None
    img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    return cv2.resize(img, (size, size), interpolation=cv2.INTER_AREA)


class _Decode(torch.utils.data.Dataset):
    def __init__(self, paths: list[str], size: int):
        self.paths, self.size = paths, size

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        img = read_image(self.paths[i], self.size)
        return i, (np.zeros((self.size, self.size, 3), np.uint8) if img is None else img), img is not None


def image_cache(paths: list[str], names: list[str], size: int, cache_dir: Path, tag: str, workers: int) -> np.ndarray:
    """Decode every image once into a uint8 memmap of shape (n, size, size, 3).

    JPEG decoding is the CPU bottleneck on Kaggle's 4 vCPUs: decoding 10k dog photos every
    epoch costs more than the GPU step. Later epochs, folds and reruns read this cache.
    `names` say where each path came from ("labels.csv row 17") for the error message.
    """
    cache_dir.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha1("\n".join(paths).encode()).hexdigest()[:16]
    data_file, meta_file = cache_dir / f"{tag}_{size}px.u8", cache_dir / f"{tag}_{size}px.json"
    shape = (len(paths), size, size, 3)
    if meta_file.exists() and data_file.exists() and json.loads(meta_file.read_text()).get("key") == key:
        return np.memmap(data_file, dtype=np.uint8, mode="r", shape=shape)
    t0 = time.time()
    tmp = data_file.with_suffix(".tmp")
    arr = np.memmap(tmp, dtype=np.uint8, mode="w+", shape=shape)
    loader = torch.utils.data.DataLoader(
        _Decode(paths, size), batch_size=64, num_workers=workers, collate_fn=lambda b: b
    )
    for batch in loader:
        for i, img, ok in batch:
            if not ok:
                raise DataError(f"{paths[i]}: missing or cannot be decoded as an image ({names[i]})")
            arr[i] = img
    arr.flush()
    del arr
    os.replace(tmp, data_file)
    atomic_write(meta_file, lambda t: Path(t).write_text(json.dumps({"key": key, "shape": shape})))
    print(f"CACHE: decoded {len(paths)} {tag} images to {size}x{size} in {time.time() - t0:.1f}s -> {data_file}")
    return np.memmap(data_file, dtype=np.uint8, mode="r", shape=shape)


# ----------------------------------------------------------------------------- models


class WeightsUnavailable(SystemExit):
    """Pretrained weights asked for but not to be had; train.py --dry-run falls back to random init."""


def hub_reachable(host: str = "huggingface.co", timeout: float = 3.0) -> bool:
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def create_timm_model(name: str, num_classes: int, pretrained: bool, weights: str = "") -> torch.nn.Module:
    """A timm model; pretrained weights from a local file (`weights`) or the hub.

    Without network (Kaggle with internet off) timm would retry the hub for ~50 s and then
    fail; we check first and stop in seconds with the way out.
    """
    import timm

    if weights:
        if not Path(weights).is_file():
            raise SystemExit(f"--weights {weights}: no such file")
        # timm loads the file (safetensors or torch, weights_only) and drops a mismatched head
        return timm.create_model(
            name, pretrained=True, num_classes=num_classes, pretrained_cfg_overlay={"file": str(weights)}
        )
    if pretrained and not hub_reachable():
        raise WeightsUnavailable(
            f"pretrained weights for {name} were asked for, but the model hub is unreachable (internet off?). "
            f"Attach the weights as a Kaggle dataset and pass --weights /kaggle/input/<dataset>/<file>.safetensors "
            f"(timm: model.default_cfg['hf_hub_id'] names them), or train from scratch with --no-pretrained."
        )
    return timm.create_model(name, pretrained=pretrained, num_classes=num_classes)


# ----------------------------------------------------------------------------- time budget


def make_planner(budget: str, start_time: float, folds: int, epochs: int, device: torch.device) -> TimePlanner:
    """The run's planner: --budget parsed (on Kaggle with none, 9h), SIGTERM handled."""
    try:
        seconds = hardware.parse_duration(budget)
    except ValueError as e:
        raise SystemExit(f"ERROR: --budget: {e}") from None
    if seconds is None and on_kaggle():
        seconds = hardware.parse_duration(hardware.KAGGLE_BUDGET)
        print(f"TIME: on Kaggle with no --budget: using {hardware.KAGGLE_BUDGET}, the code-competition limit")
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    planner = TimePlanner(
        seconds, folds, epochs, elapsed_s=time.time() - start_time, startup_s=process_age(), sync=sync
    )
    planner.install_sigterm()
    return planner


def process_age() -> float:
    """Seconds since this process started (interpreter start and imports included); Linux only."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 10.0


def fmt_s(seconds: float) -> str:
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"


class TimePlanner:
    """Plans folds and epochs to fit a wall-time budget, re-plans with measured times, and
    guards the deadline so prediction always gets its reserve.

    The rules (docs/time-budget.md): keep max(15% of the budget, the measured prediction
    estimate) for predict.py; if the plan needs more than 80% of the training time left, cut
    folds to 3, then epochs by 30% and 50% (never below `min_epochs`), then folds towards 1
    (giving back as many epochs as then fit, up to the plan's), and at 1 fold fit the epochs.
    Re-plan after every epoch with measured times (fit 95%, minimal cuts), and at once if the
    first fold took > 20% of the budget.

    Seam for tests: `clock` (monotonic seconds) and `sync` (torch.cuda.synchronize on CUDA, so
    step timings are real); a fake clock drives every decision deterministically.
    """

    RESERVE_FRACTION, FIRST_FOLD_FRACTION = 0.15, 0.20
    PLAN_FRACTION, REPLAN_FRACTION = 0.80, 0.95  # an estimate gets 20% slack; measured epochs 5%
    WARMUP_BATCHES, MEASURE_BATCHES = 2, 5  # skip compile / cuDNN autotune, then time 5 batches
    PREDICT_MARGIN = 1.25  # +25% on the measured prediction estimate

    def __init__(
        self,
        budget_s,
        folds,
        epochs,
        min_epochs=3,
        elapsed_s=0.0,
        startup_s=10.0,
        clock=time.monotonic,
        sync=None,
        log=print,
    ):
        self.budget, self.folds, self.epochs = budget_s, folds, epochs
        self.min_epochs = min(min_epochs, epochs)
        self.clock, self.sync, self.log = clock, sync or (lambda: None), log
        self.t0 = clock() - elapsed_s
        self.predict_s = 0.0
        self.startup_s = startup_s  # predict.py pays the same interpreter start and imports as train.py did
        self.epoch_s: list[float] = []
        self.stop_reason: str | None = None
        self.planned = False  # the first estimate (after warm-up) has been made
        self._fold = self._epoch = self._batches = self._valid_batches = 0
        self._fold_finished = False
        self._steady_epoch_s = 0.0  # epoch time from the timed steps after warm-up
        self._epoch_t0 = self._measure_t0 = self._fold_t0 = None

    # --- where we stand
    def elapsed(self) -> float:
        return self.clock() - self.t0

    def reserve(self) -> float:
        return max(self.RESERVE_FRACTION * self.budget, self.predict_s) if self.budget else 0.0

    def training_left(self) -> float:
        return self.budget - self.reserve() - self.elapsed()

    def status_line(self) -> str:
        plan = f"plan folds={self.folds} epochs={self.epochs}"
        if not self.budget:
            return f"TIME: elapsed {fmt_s(self.elapsed())}, no budget (--budget 9h plans folds and epochs), {plan}"
        last = f", epoch ~{fmt_s(self.epoch_s[-1])}" if self.epoch_s else ""
        return (
            f"TIME: elapsed {fmt_s(self.elapsed())} of {fmt_s(self.budget)} budget, remaining "
            f"{fmt_s(self.budget - self.elapsed())} (reserve {fmt_s(self.reserve())} for predict), {plan}{last}"
        )

    # --- signals
    def install_sigterm(self) -> None:
        """SIGTERM (a container's stop) ends training like the deadline: save, then exit 0."""
        signal.signal(signal.SIGTERM, lambda *_: self.request_stop("SIGTERM"))

    def request_stop(self, reason: str) -> None:
        self.stop_reason = self.stop_reason or reason

    # --- hooks the training loop calls
    def begin_fold(self, fold: int) -> None:
        self._fold, self._fold_t0, self._fold_finished, self._epoch = fold, self.clock(), False, 0

    def begin_epoch(self, batches: int, valid_batches: int) -> None:
        self._batches, self._valid_batches = batches, valid_batches
        self._epoch_t0 = self.clock()

    def tick(self, batch: int) -> bool:
        """After each training batch: time the first steps after warm-up (the first estimate)
        and say whether to stop now (deadline passed or SIGTERM)."""
        if self.budget and not self.planned:
            if batch == self.WARMUP_BATCHES - 1:
                self.sync()
                self._measure_t0 = self.clock()
            elif self._measure_t0 is not None and batch == self.WARMUP_BATCHES - 1 + self.MEASURE_BATCHES:
                self.sync()
                self._first_plan((self.clock() - self._measure_t0) / self.MEASURE_BATCHES)
        if self.budget and self.training_left() <= 0:
            self.request_stop("deadline")
        return self.stop_reason is not None

    def end_epoch(self, epoch: int) -> None:
        self._epoch = epoch  # epochs of this fold done
        self.epoch_s.append(self.clock() - self._epoch_t0)
        if self.budget and not self.planned:  # too few batches to time steps: plan from the epoch
            self._first_plan(None)
        elif self.budget:
            self._replan(self._epoch_estimate(), f"re-plan at {fmt_s(self._epoch_estimate())}/epoch")

    def end_fold(self, fold: int, first: bool) -> None:
        took = self.clock() - self._fold_t0
        self._fold_finished = True
        if self.budget and first and took > self.FIRST_FOLD_FRACTION * self.budget:
            why = f"fold {fold} took {fmt_s(took)} = {100 * took / self.budget:.0f}% of the budget (> 20%)"
            if not self._replan(max(self._epoch_estimate(), took / max(1, self._epoch)), why):
                self.log(f"TIME PLAN: {why} -> plan kept: folds={self.folds} epochs={self.epochs}")

    def can_start_epoch(self) -> bool:
        """Deadline guard: no epoch starts that would eat into the prediction reserve."""
        if self.stop_reason:
            return False
        if self.budget and self.epoch_s and self.elapsed() + self.epoch_s[-1] + self.reserve() > self.budget:
            self.request_stop("deadline")
            self.log(
                f"DEADLINE: elapsed {fmt_s(self.elapsed())} + next epoch ~{fmt_s(self.epoch_s[-1])} + reserve "
                f"{fmt_s(self.reserve())} > budget {fmt_s(self.budget)}: stopping, prediction runs next"
            )
            return False
        return True

    def note_inference(self, seconds, samples, test_rows, views, decode_s_per_image, model_s=1.0) -> None:
        """Measured validation speed -> the prediction estimate (and so the reserve): process start
        and imports, then per fold a model build and the test set's views, plus decoding the test set."""
        per_sample = seconds / max(samples, 1)
        folds_s = self.folds * (model_s + per_sample * test_rows * views)
        self.predict_s = self.PREDICT_MARGIN * (self.startup_s + folds_s + decode_s_per_image * test_rows)

    # --- planning
    def _epoch_estimate(self) -> float:
        """The slowest of the last 3 epochs (estimates err on the safe side), leaving out the
        run's first epoch, which carries the warm-up, while the step-timed estimate stands in."""
        recent = self.epoch_s[1:][-3:]
        if recent:
            return max(recent)
        return self._steady_epoch_s or (self.epoch_s[-1] if self.epoch_s else 0.0)

    def _first_plan(self, s_per_step: float | None) -> None:
        self.planned = True
        if s_per_step is None:
            epoch_s, how = self.epoch_s[-1], f"{fmt_s(self.epoch_s[-1])}/epoch measured"
        else:
            valid_s = s_per_step * 2 / 3 * self._valid_batches  # forward only, batches twice as big
            epoch_s = s_per_step * self._batches + valid_s
            how = f"{s_per_step:.3f} s/step x {self._batches} steps + validation ~{fmt_s(valid_s)}"
            self._steady_epoch_s = epoch_s
        total = epoch_s * self.epochs * self.folds
        self.log(
            f"TIME ESTIMATE: {how} = {fmt_s(epoch_s)}/epoch x {self.epochs} epochs x {self.folds} folds = "
            f"{fmt_s(total)} for the whole plan; training budget {fmt_s(self.budget - self.reserve())} "
            f"(reserve {fmt_s(self.reserve())} for predict)"
        )
        if not self._replan(epoch_s, "estimate", first=True):
            self.log(f"TIME PLAN: fits, kept folds={self.folds} epochs={self.epochs}")

    def _need(self, epoch_s: float, folds: int, epochs: int) -> float:
        """Seconds the rest of a plan needs: this fold's remaining epochs, then the later folds."""
        this_fold = 0 if self._fold_finished else max(0, epochs - self._epoch)
        return (this_fold + (folds - self._fold - 1) * epochs) * epoch_s

    def _fit_epochs(self, epoch_s: float, folds: int, limit: float) -> int:
        """The most epochs (up to the plan's) whose rest of the plan fits `limit`; at least 1."""
        return next((e for e in range(self.epochs, 0, -1) if self._need(epoch_s, folds, e) <= limit), 1)

    def _replan(self, epoch_s: float, why: str, first: bool = False) -> bool:
        """Cut folds to 3, then epochs, then folds towards 1 until the rest of the plan fits.

        The first plan (an estimate from a few timed steps) must fit 80% of the training time
        left and cuts epochs by 30%, then 50%; later re-plans use measured epochs, must fit 95%,
        and cut no more epochs than needed. Epochs never go below the floor before folds go."""
        fraction = self.PLAN_FRACTION if first else self.REPLAN_FRACTION
        limit = fraction * self.training_left()
        need = self._need(epoch_s, self.folds, self.epochs)
        if need <= limit:
            return False

        def fits(f, e):
            return self._need(epoch_s, f, e) <= limit

        folds, epochs = self.folds, self.epochs
        if not fits(folds, epochs) and folds > 3:
            folds = max(self._fold + 1, 3)
        if not fits(folds, epochs) and epochs > self.min_epochs:
            if first:
                for frac in (0.7, 0.5):
                    if not fits(folds, epochs):
                        epochs = max(self.min_epochs, round(self.epochs * frac))
            else:
                epochs = max(self.min_epochs, self._fit_epochs(epoch_s, folds, limit))
        if not fits(folds, epochs) and folds > self._fold + 1:
            while not fits(folds, epochs) and folds > self._fold + 1:
                folds -= 1  # towards 1 fold: keep as many as fit (each fold is a model in the ensemble)
            # fewer folds free time: give epochs back, up to the plan's, as many as fit
            epochs = max(epochs, self._fit_epochs(epoch_s, folds, limit))
        if not fits(folds, epochs):  # last resort: fit this fold's epochs
            epochs = min(epochs, self._fit_epochs(epoch_s, folds, limit))
        cuts = [
            f"{name} {a}->{b}"
            for name, a, b in (("folds", self.folds, folds), ("epochs", self.epochs, epochs))
            if a != b
        ]
        if not cuts:
            return False
        label = f"estimate {fmt_s(need)}" if first else f"{why}: need {fmt_s(need)}"
        self.log(
            f"TIME PLAN: {label} > {fraction:.0%} of {fmt_s(max(0.0, self.training_left()))} training time left "
            f"-> {', '.join(cuts)}"
        )
        self.folds, self.epochs = folds, epochs
        return True
