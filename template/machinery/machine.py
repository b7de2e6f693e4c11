"""Where a run trains and with what batch: the device's profile, precision (Machine), the one
home of batch size, accumulation and LR (Batching), the small-data shrink and the start lines.

It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import gpu, hardware, logs, parallel, profiles
from . import planner as time_planner
from .gpu import Amp, GpuMonitor, describe_gpu
from .planner import TimePlanner


@dataclass
class Batching:
    """The one home of batch size, accumulation and LR; the probe and OOM recovery change them here."""

    size: int  # rows per forward/backward, per process
    accum_steps: int  # batches per optimizer step: effective batch = size x world x accum_steps
    lr: float  # peak LR for that effective batch
    parts: int = 1  # OOM recovery: each batch is split into this many micro-batches (doubles on OOM)
    world: int = field(default_factory=parallel.world_size)  # DDP ranks averaging their gradients
    eval_size: int = 0  # validation rows per forward, sized on its own by the probe; 0 = 2 x size
    # why the batch is what it is, (key, detail): rule, user, small-data, probe or oom (logs.validation_line)
    why: tuple = ("rule", "the GPU profile's rule")

    def __post_init__(self):
        # train.py's LR rule saw one process's batch; under DDP the gradient averages `world` of
        # them, so the rule (hardware.scaled_lr's square root) is applied to the whole effective batch
        one = self.size * self.accum_steps
        self.lr *= hardware.scaled_lr(1.0, one * self.world) / hardware.scaled_lr(1.0, one)

    @property
    def effective(self) -> int:
        return self.size * self.accum_steps * self.world

    @property
    def eval_rows(self) -> int:
        """Validation batch: no gradients, so 2x the training batch unless the probe measured it."""
        return self.eval_size or self.size * 2


@dataclass
class Machine:
    """Where the run trains: device, precision and input pipeline, fixed for the whole run."""

    device: torch.device
    amp: Amp
    loader: dict  # DataLoader settings (workers, prefetch, pinning); tables: in-memory
    channels_last: bool  # NHWC inputs and weights (CNNs on CUDA)
    monitor: GpuMonitor
    cpus: int


def profile(gpu_flag: str, device: torch.device) -> hardware.Profile:
    """The profile every rule reads (batch, workers, text max_len and checkpointing). On CUDA the
    detected card wins over --gpu (the project's rendered profile): a project rendered for an A100
    and run on a T4 takes the T4's rules, with a WARNING line naming both. An unlisted card gets a
    profile built from its memory and compute capability. On CPU: the cpu profile."""
    if device.type != "cuda":
        if gpu_flag not in ("auto", "cpu"):  # the a10 batch on a CPU: 23 GB, killed
            print(f"WARNING: --gpu {gpu_flag} but training on {device.type}: batch and workers follow the CPU profile")
        return hardware.PROFILES["cpu"]
    name, total_gb, capability = describe_gpu(device)
    found, warning = profiles.profile_for(name, total_gb, capability, hardware.usable_cpus())
    if warning:
        print(f"WARNING: {warning}")
    wanted = hardware.PROFILES.get(gpu_flag)
    same = wanted is not None and (wanted.memory_gb, wanted.capability) == (found.memory_gb, found.capability)
    if wanted is not None and not same:
        print(
            f"WARNING: --gpu {gpu_flag} ({wanted.label}, {wanted.memory_gb:g} GB) but this card is {name} "
            f"({total_gb:.0f} GB, compute capability {capability[0]}.{capability[1]}): its rules are used"
        )
    return found


def make_planner(args, machine: Machine) -> TimePlanner:
    """The run's time planner (planner.py), timing real steps: CUDA is synchronised before each reading."""
    sync = torch.cuda.synchronize if machine.device.type == "cuda" else None
    folds = min(args.folds, args.train_folds or args.folds)  # --train-folds 1: fold 0 only (tune.py's trials)
    # --predict-beside (run.py's): predict.py started beside this train.py and paid its imports there
    fixed = args.predict_reserve if args.predict_reserve >= 0 else None  # --predict-reserve: seconds, not the rule
    worker = parallel.fold_worker()  # the folds left are shared by this many workers
    sharing = worker[1] if worker else 1
    return time_planner.make_planner(
        args.budget, args.start_time, folds, args.epochs, sync, args.predict_beside, fixed, sharing
    )


def make_machine(device: torch.device, amp_flag: str, loader: dict, channels_last: bool) -> Machine:
    """Precision from --amp (gpu.training_amp: auto is bf16 on compute capability >= 8, fp16 +
    GradScaler on T4/V100; bf16 asked for on a T4/V100 becomes fp16 with a warning)."""
    capability = describe_gpu(device)[2]
    mode, warning = gpu.training_amp(amp_flag, capability)
    if warning and device.type == "cuda":
        print(f"WARNING: {warning}")
    return machine_for(device, mode, loader, channels_last)


def inference_machine(device: torch.device, checkpoints: list, loader: dict, channels_last: bool) -> Machine:
    """predict.py's machine for the ensemble's [(path, checkpoint)]: the precision they were trained
    with where this device runs it, else fp32 (gpu.inference_amp; folds trained in different
    precisions, a resume with another --amp: fp32), printed as a PRECISION: line."""
    trained = {ckpt["config"].get("amp") for _, ckpt in checkpoints}
    mode, why = gpu.inference_amp(trained.pop() if len(trained) == 1 else "mixed", describe_gpu(device)[2])
    print(f"PRECISION: {mode} ({why})")
    return machine_for(device, mode, loader, channels_last)


def machine_for(device: torch.device, mode: str, loader: dict, channels_last: bool) -> Machine:
    on_cuda = device.type == "cuda"
    return Machine(
        device, Amp(mode, device), loader, on_cuda and channels_last, GpuMonitor(device), hardware.usable_cpus()
    )


def can_compile(device: torch.device) -> tuple[bool, str]:
    """torch.compile's GPU code is Triton's, which needs compute capability >= 7.0 (a P100 fails
    inside Triton at the first step)."""
    capability = describe_gpu(device)[2]
    if device.type == "cuda" and capability < (7, 0):
        return (
            False,
            f"--compile needs compute capability >= 7.0 (Triton); this card has {capability[0]}.{capability[1]}",
        )
    return True, ""


def print_start(machine: Machine, batching: Batching, why: str) -> None:
    """The RESOURCES / GPU Memory / DataLoader / BATCH lines every run starts with."""
    name, total_gb, _ = describe_gpu(machine.device)
    lines = logs.resource_lines(machine.cpus, batching.size, name, machine.amp.enabled, total_gb, machine.loader)
    print(*lines, sep="\n")
    print(logs.batch_line(batching.size, batching.accum_steps, why, batching.world))


def batch_set_by_user(args) -> bool:
    """--batch-size or --accum-steps given: neither the small-data shrink nor the probe touches them."""
    return bool(args.batch_size or getattr(args, "accum_steps", 0))


def fit_steps(batching: Batching, rows: int, base_lr: float) -> None:
    """Small data: shrink accumulation, then the batch, so an epoch of `rows` keeps at least
    hardware.MIN_STEPS_PER_EPOCH optimizer steps (3 steps an epoch do not train); the LR follows
    the one rule (hardware.scaled_lr)."""
    rows //= batching.world  # under DDP each rank steps through its share
    batch, accum = hardware.fit_to_steps(batching.size, batching.accum_steps, rows)
    if (batch, accum) == (batching.size, batching.accum_steps):
        return
    batching.size, batching.accum_steps = batch, accum
    batching.lr = hardware.scaled_lr(base_lr, batching.effective)
    batching.why = (
        "small-data",
        f"{rows} training rows, at least {hardware.MIN_STEPS_PER_EPOCH} optimizer steps an epoch",
    )
    print(logs.batch_line(batch, accum, f"small data: {batching.why[1]}; lr {batching.lr:.2e}", batching.world))
