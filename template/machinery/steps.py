"""The step loop inside one epoch: AMP, gradient accumulation and OOM recovery; the optimizer,
the LR schedule, batches on the device, and prediction over batches (validation and predict.py).

fold.py calls `run_epoch` once per epoch. It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from . import parallel
from .gpu import free_gpu_memory, is_oom

# ----------------------------------------------------------------------------- batches on the device


def to_device(batch, machine):
    """A batch (a tensor or a tuple of them) on the device; 4-D inputs (uint8 images too) as NHWC when
    channels_last, so the model's NHWC weights meet NHWC activations."""
    if isinstance(batch, torch.Tensor):
        if machine.channels_last and batch.dim() == 4:
            return batch.to(machine.device, non_blocking=True, memory_format=torch.channels_last)
        return batch.to(machine.device, non_blocking=True)
    return type(batch)(to_device(b, machine) for b in batch)


def loader(comp, rows, batch: int, train: bool, sampler):
    """The competition's batches; under DDP with this rank's DistributedSampler."""
    if sampler is None:
        return comp.loader(rows, batch, train)
    return comp.loader(rows, batch, train, sampler=sampler)


def batch_rows(batch) -> int:
    return len(batch) if isinstance(batch, torch.Tensor) else batch_rows(batch[0])


def split_batch(batch, parts: int) -> list:
    """A batch (a tensor, or a tuple/list of them) cut into `parts` pieces along the rows."""
    if isinstance(batch, torch.Tensor):
        return list(torch.tensor_split(batch, parts))
    pieces = [split_batch(b, parts) for b in batch]
    return [type(batch)(p[k] for p in pieces) for k in range(parts)]


@torch.no_grad()
def predict(predict_fn, model, batches, machine, max_batches=None, on_batch=None) -> np.ndarray | None:
    """predict_fn(model, batch) for every batch, in order: validation here, the test set in predict.py.
    Outputs stay on the device until the end (one copy back, one sync). A batch that runs out of
    memory is predicted in halves (then quarters, ...), and the rest of the batches at that size.
    `on_batch(rows done)` (predict.py's FoldClock under a deadline) is asked after each batch,
    after a device sync so its clock is true; False stops and returns None."""
    model.eval()
    out, parts, rows = [], 1, 0
    for i, batch in enumerate(batches):
        if max_batches is not None and i >= max_batches:
            break
        batch = to_device(batch, machine)
        while True:
            try:
                with machine.amp.autocast():
                    pieces = split_batch(batch, parts) if parts > 1 else [batch]
                    done = [predict_fn(model, piece).float() for piece in pieces]
                out += done
                break
            except RuntimeError as e:  # gpu.OutOfMemoryError is one
                if not is_oom(e) or parts * 2 > batch_rows(batch):
                    raise
                free_gpu_memory()
                parts *= 2
        rows += batch_rows(batch)
        if on_batch is not None:
            if machine.device.type == "cuda":
                torch.cuda.synchronize(machine.device)
            if not on_batch(rows):
                return None
    return torch.cat(out).cpu().numpy()


# ----------------------------------------------------------------------------- one epoch


def run_epoch(
    batches, n, batch_loss, optimizer, scheduler, amp, batching, on_first_step=None, should_stop=None, grads=None,
    progress=None,
):  # fmt: skip
    """One training pass over the first `n` of `batches` with gradient accumulation.

    `batch_loss(batch)` is the competition code: it returns (mean loss, rows) under autocast.
    Each accumulation group's loss is divided by the group's own size, so a last partial group
    steps the optimizer too, with a correctly scaled gradient.

    Out of GPU memory anywhere in a group (forward, backward, optimizer.step, or a cuDNN/cuBLAS
    allocation failure) is one recovery: the group's gradients and the GradScaler's step state
    are dropped, memory is freed, and the group's batches are redone as 2 (then 4, ...)
    micro-batches each: the micro-batch halves, the accumulation doubles, the effective batch
    stays. The halved micro-batch is made permanent (`batching.parts`, kept for later epochs
    and folds) only once it has carried a whole group through its optimizer step.

    Under DDP (`grads`, parallel.GradSync) every backward is local (no_sync) and every rank
    votes after each batch whether it ran out of memory: if any did, every rank drops the group
    and splits alike, so the ranks' collectives stay matched; the group's gradients are then
    averaged in one bucketed all-reduce before the optimizer step.
    `on_first_step()` runs once after the first optimizer step (the GPU memory lines);
    `should_stop(i)` is asked after every batch (the time budget's deadline, SIGTERM);
    `progress` (logs.StepProgress) is told after every closed group.
    Returns (mean loss, samples seen).
    """
    grads = grads or parallel.GradSync(None, None)
    accum, parts = batching.accum_steps, batching.parts
    total, seen = None, 0
    group, group_stats = [], []  # this group's batches (kept to redo it after an OOM) and their (loss x rows, rows)
    optimizer.zero_grad(set_to_none=True)
    for i, batch in enumerate(batches):
        if i >= n:
            break
        closes = (i + 1) % accum == 0 or i + 1 == n
        group.append(batch)
        sizes = (min(accum, n - (i // accum) * accum), closes, accum, i)
        stats, parts, redone = _carry(batch, group, batch_loss, optimizer, amp, sizes, parts, grads)
        group_stats = stats if redone else group_stats + stats
        if closes:
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            batching.parts = parts  # the micro-batch that carried this group through its step
            if on_first_step is not None:
                on_first_step()
                on_first_step = None
        stop = should_stop is not None and should_stop(i)
        if closes or stop:
            for loss_x_rows, rows in group_stats:  # on the device: no .item() sync
                total = loss_x_rows if total is None else total + loss_x_rows
                seen += rows
            group, group_stats = [], []
            if progress is not None and total is not None:
                progress.step(i + 1, seen, lambda t=total, s=seen: (t / max(s, 1)).item())
        if stop:
            break
    if progress is not None:
        progress.close()
    return (0.0 if total is None else (total / max(seen, 1)).item()), seen


def _carry(batch, group: list, batch_loss, optimizer, amp, sizes: tuple, parts: int, grads) -> tuple:
    """One batch's backward, and the optimizer step when it closes its group, with the OOM
    recovery: on an OOM the group's gradients and the scaler's step state are dropped and the
    whole group is redone at twice the micro-batches. Returns (the (loss x rows, rows) of the
    batches done, the micro-batches per batch now, whether the whole group was redone)."""
    group_size, closes, accum, i = sizes
    todo, redone = [batch], False
    while True:
        try:
            stats = grads.agreed(_backward_all, todo, batch_loss, amp, group_size, parts, grads)
            if closes:
                grads.reduce()
                grads.agreed(amp.step, optimizer, after_step=True)
            return stats, parts, redone
        except RuntimeError as e:  # gpu.OutOfMemoryError is one; under DDP, any rank's
            if not is_oom(e):
                raise
            optimizer.zero_grad(set_to_none=True)  # the group's partial gradients are dropped...
            amp.forget_step(optimizer)  # ...and so is the scaler's record of unscaling them
            free_gpu_memory()
            rows = batch_rows(batch)
            if parts * 2 > rows:
                raise
            print(
                f"OOM: batch of {rows} did not fit at step {i}: micro-batch {-(-rows // parts)} -> "
                f"{-(-rows // (2 * parts))}, accumulation {accum * parts} -> {accum * parts * 2}, "
                f"effective batch {rows * accum} unchanged" + grads.oom_note(),
                flush=True,
            )
            parts, todo, redone = parts * 2, list(group), True  # redo the whole group, halved


def _backward_all(batches, batch_loss, amp, group: int, parts: int, grads) -> list:
    return [_backward(b, batch_loss, amp, group, parts, grads) for b in batches]


def _backward(batch, batch_loss, amp, group: int, parts: int, grads):
    """Backward of one batch, as `parts` micro-batches whose gradients add up to the batch's
    (local under DDP: grads.local() is no_sync). Returns (loss x rows, rows) for the epoch's mean loss."""
    rows, loss_sum, size_sum = batch_rows(batch), None, 0
    for piece in split_batch(batch, parts) if parts > 1 else [batch]:
        with grads.local():
            with amp.autocast():
                loss, size = batch_loss(piece)
            amp.backward(loss * (size / rows) / group)
        part = loss.detach().float() * size
        loss_sum, size_sum = (part if loss_sum is None else loss_sum + part), size_sum + size
    return loss_sum, size_sum


# ----------------------------------------------------------------------------- optimizer and schedule


def make_optimizer(comp, model, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW over the competition's parameter groups when it has them (`param_groups(model)`:
    dicts of params with an `lr_scale`, e.g. layer-wise LR decay), else over every parameter."""
    groups = comp.param_groups(model) if hasattr(comp, "param_groups") else [{"params": list(model.parameters())}]
    for group in groups:
        group.setdefault("lr_scale", 1.0)
        group["lr"] = lr * group["lr_scale"]
    # None, not False, where it cannot fuse: fused=False would also turn off PyTorch's foreach
    # default on a card (torch.optim.adam: foreach is chosen only when both are None)
    return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay, fused=fusable(groups) or None)


def fusable(groups: list[dict]) -> bool:
    """Whether AdamW can step every parameter in one fused kernel: floating point, on a CPU or a
    card (QLoRA's 4-bit base weights are frozen and left out of the groups). The default steps
    tensor by tensor: on CPU that was 25 of a resnet10t batch's 66 ms (16 images of 32 px), fused
    3.7; on a card fused is PyTorch's fastest AdamW too. GradScaler's skipped steps hold."""
    params = [p for group in groups for p in group["params"]]
    return bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)


def set_lr(optimizer, lr: float) -> None:
    """The run's peak LR changed (batch probe, DDP agreement): every group follows, at its own scale."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


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


# ----------------------------------------------------------------------------- in-memory tables


class TensorBatches:
    """Batches of rows of tensors already on the device (a whole table in memory): each batch
    is a gather by a slice of a permutation made on the device; no per-row Dataset or collate.
    Yields tuples of the tensors' rows; `len()` is the number of batches."""

    def __init__(self, tensors: tuple, batch: int, shuffle: bool, drop_last: bool, sampler=None):
        self.tensors, self.batch, self.shuffle, self.sampler = tensors, batch, shuffle, sampler
        n = len(sampler) if sampler is not None else len(tensors[0])  # DDP: this rank's share
        self.drop_last = drop_last and n >= batch  # a table smaller than a batch still gives one
        self.n = n

    def __len__(self) -> int:
        return self.n // self.batch if self.drop_last else math.ceil(self.n / self.batch)

    def __iter__(self):
        device = self.tensors[0].device
        if self.sampler is not None:
            order = torch.as_tensor(list(self.sampler), device=device)
        elif self.shuffle:
            order = torch.randperm(self.n, device=device)
        else:
            order = torch.arange(self.n, device=device)
        for i in range(len(self)):
            idx = order[i * self.batch : (i + 1) * self.batch]
            yield tuple(t[idx] for t in self.tensors)
