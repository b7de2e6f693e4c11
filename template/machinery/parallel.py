"""More than one GPU: fold-parallel worker processes, or DDP through torchrun.

--parallel folds   fold k trains on one of N devices, in N independent processes (this train.py
                   started again, one per device, CUDA_VISIBLE_DEVICES set), each taking the next
                   fold from a queue of claim files in out_dir/.folds. No communication: ~2x on
                   Kaggle's T4x2 for a k-fold run, and a crash on one GPU loses one fold.
--parallel ddp     one model over all ranks (torchrun --nproc_per_node=N train.py ...):
                   DistributedSampler shards, gradients all-reduced, rank 0 alone writes; the
                   deadline and SIGTERM are agreed by all ranks in one collective each step.
--parallel auto    folds when more than one GPU is visible and --folds >= GPUs; ddp under
                   torchrun; else none. The choice and its reason are the PARALLEL: line.

The rules and their costs are in kagtpl's docs/parallel.md. It is machinery: `copier update`
may replace it, so keep your own code in train.py and predict.py.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import importlib
import os

import torch
import torch.distributed as dist

from .errors import RunError
from .gpu import OutOfMemoryError, is_oom

# A fold worker learns its place from the parent train.py through the environment, as a torchrun
# rank does from RANK / WORLD_SIZE: "index/count" and the run id its JSON log records carry.
WORKER_ENV, RUN_ID_ENV = "KAGTPL_FOLD_WORKER", "KAGTPL_RUN_ID"
MODES = ("auto", "none", "folds", "ddp")


# ----------------------------------------------------------------------------- the choice


def world_size() -> int:
    """Processes torchrun started for this run (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def fold_worker() -> tuple[int, int] | None:
    """(index, count) in a fold worker; None in the train.py that was started by hand."""
    value = os.environ.get(WORKER_ENV)
    if not value:
        return None
    index, count = value.split("/")
    return int(index), int(count)


def devices_for(flag: str, device: torch.device) -> list[str]:
    """--devices cuda:0,cuda:1 / cpu,cpu; '' = every visible GPU (none on CPU)."""
    if flag:
        names = [d.strip() for d in flag.split(",") if d.strip()]
        for name in names:
            if name != "cpu" and not (name.startswith("cuda:") and name[5:].isdigit()):
                raise RunError(f"--devices: {name!r} is not cpu or cuda:N (e.g. --devices cuda:0,cuda:1)")
            if name.startswith("cuda:") and int(name[5:]) >= torch.cuda.device_count():
                raise RunError(f"--devices: {name} asked for, but torch sees {torch.cuda.device_count()} GPU(s)")
        return names
    if device.type == "cuda":
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return ["cpu"]


def choose(mode: str, devices: list[str], folds: int) -> tuple[str, str]:
    """(mode, why): the PARALLEL: line's decision. Under torchrun only ddp makes sense."""
    world = world_size()
    if world > 1:
        if mode not in ("auto", "ddp"):
            raise RunError(f"--parallel {mode} under torchrun ({world} processes): use --parallel ddp")
        return "ddp", f"torchrun started {world} processes: one model, gradients all-reduced"
    if mode == "ddp":
        raise RunError(
            "--parallel ddp needs torchrun: torchrun --nproc_per_node=N train.py ... (or python run.py --parallel ddp)"
        )
    n = len(devices)
    if mode == "folds":
        if n < 2:
            raise RunError(f"--parallel folds needs 2 or more devices, found {n} ({','.join(devices)}): see --devices")
        return "folds", f"{n} devices ({','.join(devices)}): fold k on the next free one, {folds} folds"
    if mode == "none":
        return "none", "--parallel none: one process, one device"
    if n > 1 and folds >= n:
        return "folds", f"{n} GPUs visible and --folds {folds} >= {n}: one fold per GPU at a time"
    if n > 1:
        return "none", f"{n} GPUs visible but --folds {folds} < {n}: one process (torchrun for ddp)"
    return "none", f"one device ({devices[0]})"


# ----------------------------------------------------------------------------- ddp


def start_ddp(device_type: str, timeout: datetime.timedelta | None = None) -> torch.device:
    """Join torchrun's process group (NCCL on CUDA, gloo on CPU); this rank's device. timeout:
    how long a collective waits for the other ranks (None: PyTorch's default, 10 minutes)."""
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    # Before the group exists: torch._dynamo (which the first optimizer imports) keeps a reference
    # to the process group that is current when it is imported, so a group made first outlives
    # destroy_process_group. Its gloo threads then die at interpreter exit, under the GIL's
    # teardown: "terminate called without an active exception", SIGABRT, after a clean run.
    importlib.import_module("torch._dynamo")
    dist.init_process_group(backend, timeout=timeout)
    return device


def ddp() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if ddp() else 0


def writes() -> bool:
    """This process writes checkpoints, OOF files and logs: rank 0 (every process without DDP)."""
    return rank() == 0


STOPS = (None, "deadline", "SIGTERM")  # stop reasons as numbers, for the collective; another signal votes as SIGTERM


def agree_plan(planner, device: torch.device) -> bool:
    """One decision for every rank, in one all-reduce (MIN): stop if any rank would (its deadline
    or a SIGTERM: no rank is left waiting in a collective for one that has gone), and the
    smallest folds and epochs any rank's planner has cut to (the LR schedule follows the epochs,
    so the ranks' weights stay identical). Returns whether to stop. Without DDP: the planner's own.

    The answer is the collective's, never the local stop_reason read afterwards: a SIGTERM that
    lands while this rank waits in the all-reduce is set after the others have voted, so it
    counts in the next call, on every rank at once. Every stop decision under DDP goes through here."""
    if not ddp():
        return planner.stop_reason is not None
    reason = planner.stop_reason
    vote = STOPS.index(reason if reason in STOPS else "SIGTERM")
    t = on_device([-vote, planner.folds, planner.epochs], device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    stop, folds, epochs = (int(v) for v in t.tolist())  # the one sync of the vote
    planner.agreed(folds, epochs)
    if stop and planner.stop_reason is None:
        planner.request_stop(STOPS[-stop])
    return bool(stop)


def on_device(values: list[int], device: torch.device) -> torch.Tensor:
    """A small int64 tensor on the collective's device without a blocking copy: built in pinned host
    memory and copied asynchronously (torch.tensor(..., device="cuda") waits for the copy, a second
    sync per step beside the read of the result)."""
    host = torch.tensor(values, dtype=torch.long)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def smallest(value: int, device: torch.device) -> int:
    """The smallest of every rank's value (the batch probe: the fullest GPU decides)."""
    if not ddp():
        return value
    t = torch.tensor([value], dtype=torch.long, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def mean(value: float, device: torch.device) -> float:
    """The ranks' average (the epoch's training loss)."""
    if not ddp():
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


def sampler(rows, train: bool, seed: int):
    """A DistributedSampler over `rows` (a Dataset, or a tuple of tensors), or None without DDP.
    Validation is not shuffled: each rank gets rows r, r + world, ... (padded to equal length)."""
    if not ddp():
        return None
    n = len(rows[0]) if isinstance(rows, tuple) else len(rows)
    return torch.utils.data.DistributedSampler(range(n), shuffle=train, seed=seed, drop_last=False)


def gather_rows(pred, n: int, device: torch.device):
    """Every rank's validation predictions (rows r, r + world, ... of a DistributedSampler with
    shuffle off) back in row order, the padding dropped: the whole fold's, on every rank, so every
    rank scores the same numbers and early stopping decides the same."""
    if not ddp():
        return pred
    mine = torch.as_tensor(pred, device=device)
    parts = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, mine.contiguous())
    rows = torch.stack(parts, dim=1)  # (per rank, world, ...): row i of rank r is fold row i * world + r
    return rows.reshape(-1, *mine.shape[1:])[:n].cpu().numpy()


class DDP(torch.nn.parallel.DistributedDataParallel):
    """DistributedDataParallel that also answers for the model's own attributes, so train.py's
    `model.y_std` or `model.head` reads the same wrapped or not (the forward must go through
    the wrapper: that is where the gradient all-reduce is set up)."""

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)


class GradSync:
    """How gradients meet under DDP, with an out-of-memory error agreed by every rank.

    DDP's own all-reduce runs inside backward: a rank that runs out of memory and redoes its batch
    as two micro-batches makes extra backward passes, and the ranks' collectives no longer match
    ("Expected to have finished reduction", or an NCCL hang until the timeout). So every backward
    here is local (`local()` is DDP's no_sync), and after each batch every rank votes in one
    all-reduce whether it ran out of memory (`agreed`): if any did, every rank raises the same
    OOM and splits alike. The group's gradients are then averaged in bucketed all-reduces
    (`reduce`) before the optimizer step. The cost: the reduction no longer overlaps the backward.
    Without DDP every method is a no-op and errors pass through untouched."""

    BUCKET = 25 * 1024 * 1024 // 4  # elements per all-reduce (DDP's default bucket: 25 MB of fp32)

    def __init__(self, model, device):
        self.model, self.device = model, device
        self.on = model is not None and ddp() and isinstance(model, torch.nn.parallel.DistributedDataParallel)

    def local(self):
        return self.model.no_sync() if self.on else contextlib.nullcontext()

    def agreed(self, fn, *args, after_step: bool = False):
        """fn(*args), with every rank told whether any rank ran out of memory in it."""
        if not self.on:
            return fn(*args)
        result, error = None, None
        try:
            result = fn(*args)
        except RuntimeError as e:
            if not is_oom(e):
                raise
            error = e
        t = on_device([1 if error is not None else 0], self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if not int(t.item()):
            return result
        if after_step:  # the other ranks have already applied the step: no redo keeps them equal
            raise RunError(
                "DDP: out of GPU memory in optimizer.step on a rank while the others stepped: "
                "rerun with a smaller --batch-size (the ranks' weights would differ)"
            )
        raise error if error is not None else OutOfMemoryError("out of memory on another DDP rank")

    def oom_note(self) -> str:
        """The OOM: line's ending under DDP: the split is every rank's."""
        return " (every DDP rank splits alike)" if self.on else ""

    def sync_buffers(self) -> None:
        """Rank 0's buffers (BatchNorm's running statistics) to every rank, before validation: DDP
        broadcasts them only in forwards that sync, and these never do; rank 0's are the ones saved."""
        if self.on:
            for buffer in self.model.module.buffers():
                dist.broadcast(buffer, 0)

    def reduce(self) -> None:
        """Average the group's gradients over the ranks, in buckets of one dtype."""
        if not self.on:
            return
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:  # unused this group on this rank: zeros, so every rank's buckets match
                p.grad = torch.zeros_like(p)
        bucket, size = [], 0
        for p in params:
            if bucket and (p.grad.dtype != bucket[0].dtype or size >= self.BUCKET):
                self.mean_over_ranks(bucket)
                bucket, size = [], 0
            bucket.append(p.grad)
            size += p.grad.numel()
        if bucket:
            self.mean_over_ranks(bucket)

    @staticmethod
    def mean_over_ranks(tensors: list[torch.Tensor]) -> None:
        """One all-reduce for tensors of one dtype, flattened together; each becomes the ranks' mean."""
        flat = torch._utils._flatten_dense_tensors(tensors)
        dist.all_reduce(flat)
        flat /= dist.get_world_size()
        for t, reduced in zip(tensors, torch._utils._unflatten_dense_tensors(flat, tensors), strict=True):
            t.copy_(reduced)


def wrap(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    if not ddp():
        return model
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)


def check_in_sync(model: torch.nn.Module, device: torch.device) -> None:
    """DDP's promise, checked once a fold: every rank ends with the same weights (a schedule or a
    batch that differed between ranks would have them drift apart silently)."""
    if not ddp():
        return
    total = torch.stack([p.detach().double().sum() for p in model.parameters()]).sum().reshape(1).to(device)
    sums = [torch.empty_like(total) for _ in range(dist.get_world_size())]
    dist.all_gather(sums, total)
    values = [float(v.item()) for v in sums]
    if max(values) - min(values) > 1e-6 * max(1.0, abs(values[0])):
        raise RunError(f"DDP: the ranks' weights differ after the fold (sums {values}): training is not in lockstep")


def barrier() -> None:
    if ddp():
        dist.barrier()


def finish_ddp() -> None:
    """Leave the process group together, with a barrier as the last collective (rank 0 scores and
    reports after the folds while the other ranks are done). destroy_process_group then joins
    gloo's threads while the interpreter is whole; see start_ddp for what kept them alive."""
    if ddp():
        # What still holds the group in a reference cycle (the DDP model in the frames of a caught
        # out-of-memory error's traceback) goes first: left to the interpreter's exit, gloo's threads
        # died there, SIGABRT after a clean run (2 of 30 runs of tests/ddp_oom.py on 2 busy cores).
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
