"""The rules that turn a GPU profile (profiles.py) into batch size, workers and precision.

Pure Python, no torch: kagtpl's generator imports this same file for `kagtpl gpus`
and `kagtpl recommend`, and train.py uses it at run time, so both always agree.
It is machinery: `copier update` may replace it, so keep your own code elsewhere.
"""

from __future__ import annotations

import math
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

# The profile table and the precision rule live in profiles.py; scripts and kagtpl's generator
# read them here too (hardware.PROFILES), beside the rules that use them.
from .profiles import DEFAULT_PROFILE, KAGGLE_PROFILES, PROFILES, Profile, amp_mode  # noqa: F401 (re-exported)

# Each numeric setting's valid range, once: copier.yml's validators, `kagtpl new` and the flags check them
RANGES = {
    "image_size": (16, 2048),
    "work_size": (32, 8192),
    "folds": (2, 20),
    "epochs": (1, 1000),
    "batch_size": (0, 65536),
}


def on_kaggle() -> bool:
    """A Kaggle notebook: data read-only under /kaggle/input, outputs kept only in /kaggle/working."""
    return "KAGGLE_KERNEL_RUN_TYPE" in os.environ


def kaggle_root() -> str:
    """/kaggle, or $KAGGLE_ROOT: the whole tree moves with it (tests simulate Kaggle under a temp dir)."""
    return os.environ.get("KAGGLE_ROOT", "/kaggle")


def competition_dir(slug: str) -> str:
    """The competition's data on Kaggle: /kaggle/input/<slug>, or /kaggle/input/competitions/<slug>
    (newer notebooks mount it there), whichever exists; the first when neither does (the error then
    names it)."""
    places = [os.path.join(kaggle_root(), "input", *where, slug) for where in ((), ("competitions",))]
    return next((p for p in places if os.path.isdir(p)), places[0])


PROJECT = Path(__file__).resolve().parent.parent  # the folder train.py, predict.py and run.py are in


PROJECT_AND_ABOVE = frozenset(map(str, (PROJECT, *PROJECT.parents)))


def holds_project(path) -> bool:
    """Whether `path` is the project folder or one above it (a data folder `kagtpl new` was run in)."""
    return os.path.realpath(path) in PROJECT_AND_ABOVE


def in_project(name: str) -> str:
    """`name` in the project folder, whatever folder the script was started from (`python
    /proj/train.py` wrote ./output in the caller's folder): as given when started from the
    project (the log's lines say output/...), else the absolute path."""
    try:
        here = Path.cwd().resolve() == PROJECT
    except OSError:  # the caller's folder was deleted
        here = False
    return name if here else str(PROJECT / name)


def data_and_output_dirs(competition: str, data_dir: str) -> tuple[str, str]:
    """Where the data is read and everything is written: `data_dir` and output/; on Kaggle the competition's
    folder (read-only; $KAGTPL_COMPETITION's, kagtpl kaggle's, else the project's) and /kaggle/working."""
    if on_kaggle():
        slug = os.environ.get("KAGTPL_COMPETITION", "").strip() or competition
        return competition_dir(slug), os.path.join(kaggle_root(), "working")
    return data_dir, in_project("output")


def command(script: str, *flags: str) -> str:
    """`python SCRIPT FLAGS` to run as written from where this process started: the script's path
    when that is not the project folder (in_project), shell-quoted (a folder with a space)."""
    return shlex.join(["python", in_project(script), *flags])


def run_files(root: Path, name: str) -> list[Path]:
    """The files called `name` one and two folders below `root`, in name order: the run folders'
    (train.py --out-dir exp1, a dry run's output/dry-run), for a line that names them when the
    default folder holds none."""
    return sorted({*root.glob(f"*/{name}"), *root.glob(f"*/*/{name}")})


def dry_run_dir(out_dir: str) -> str:
    """--dry-run's own folder when --out-dir is not given: output/dry-run (once, whoever asks)."""
    return out_dir if Path(out_dir).name == "dry-run" else str(Path(out_dir) / "dry-run")


# Batch anchors from the field notes: A10 (24 GB), 224 px, AMP on, EfficientNet-B4/B5 or a
# ResNet -> 128 (192 aggressive); 384 px -> 64; EfficientNet-B6/B7 -> 64; A100-40 -> 192 (256).
ANCHOR_BATCH = 128
ANCHOR_MEMORY_GB = 24.0
MIN_GPU_BATCH = 32  # batch=32 on a big GPU is the failure kagtpl exists to prevent
MIN_DECODER_BATCH = 8  # a segmentation decoder at 512 px: 8 tiles is the floor (BatchNorm's statistics)
CPU_BATCH = 32
TARGET_EFFECTIVE_BATCH = 128  # accumulation tops a smaller micro-batch up to this
# segmentation: each tile is thousands of labelled pixels; Kaggle's segmentation solutions train
# at 8-32 tiles a step, so accumulation tops a decoder's batch up to 32, not 128
DECODER_EFFECTIVE_BATCH = 32

# Memory per sample does not grow with pixel count alone (weights, workspace), so the
# resolution factor is a table fitted to the anchors: 224 px -> 1, 384 px -> 1/2.
RESOLUTION_FACTORS = ((256, 1.0), (320, 0.75), (384, 0.5), (512, 0.25), (768, 0.125))
MIN_RESOLUTION_FACTOR = 0.0625

# Model size classes. "large" models should fill 70%+ of GPU memory, "small" ones may sit
# at 50-60% (field notes). "heavy" is large with half the memory budget per batch.
HEAVY_PATTERNS = (
    "efficientnet_b6",
    "efficientnet_b7",
    "efficientnet_b8",
    "efficientnetv2_l",
    "efficientnetv2_xl",
    "vit_large",
    "vit_huge",
    "convnext_large",
    "convnext_xlarge",
    "eva_large",
    "beit_large",
    "swin_large",
)
LARGE_PATTERNS = (
    "efficientnet_b4",
    "efficientnet_b5",
    "efficientnetv2_m",
    "resnet101",
    "resnet152",
    "resnext101",
    "vit_",
    "deit_",
    "swin_",
    "beit_",
    "eva",
    "densenet161",
    "densenet201",
    "convnext_base",
    "convnext_small",
    "bert",
    "roberta",
    "deberta",
)
SMALL_PATTERNS = (
    "resnet18",
    "resnet34",
    "resnet10",
    "resnet14",
    "efficientnet_b0",
    "efficientnet_b1",
    "efficientnet_b2",
    "efficientnet_b3",
    "mobilenet",
    "mnasnet",
    "ghostnet",
    "regnetx_002",
    "lcnet",
    "convnext_atto",
    "convnext_femto",
    "convnext_pico",
    "convnext_nano",
    "mlp",
)
LARGE_PARAMS_M = 25.0  # fallback for names not listed: ResNet-50 (25.6M) and up count as large


def model_class(model: str, params_m: float | None = None) -> str:
    """'small', 'large' or 'heavy' (large, half the batch). Name first, then parameter count."""
    name = model.lower().replace("tf_", "").split(".")[0]
    for cls, patterns in (("heavy", HEAVY_PATTERNS), ("large", LARGE_PATTERNS), ("small", SMALL_PATTERNS)):
        if any(name.startswith(p) or p in name for p in patterns):
            return cls
    if params_m is not None:
        return "large" if params_m >= LARGE_PARAMS_M else "small"
    return "large"  # unknown and unmeasured: assume the memory-hungry case


def size_class(model: str, params_m: float | None = None) -> str:
    """The two classes the log and the decision matrix use: 'small' or 'large'."""
    return "small" if model_class(model, params_m) == "small" else "large"


def resolution_factor(image_size: int) -> float:
    for limit, factor in RESOLUTION_FACTORS:
        if image_size <= limit:
            return factor
    return MIN_RESOLUTION_FACTOR


def round_to(x: float, multiple: int) -> int:
    """Down to a multiple of `multiple` (tensor cores want multiples of 8), at least `multiple`."""
    return max(multiple, int(x // multiple) * multiple)


MIN_STEPS_PER_EPOCH = 30  # an epoch keeps >= 30 optimizer steps: small data shrinks the batch, the probe stops
LR_REFERENCE_BATCH = 128  # --lr is the peak LR for effective batches up to 128 ...


def scaled_lr(lr: float, effective_batch: int) -> float:
    """... and above 128, lr x sqrt(effective / 128): square-root scaling, the rule for Adam-type
    optimizers (linear scaling is SGD's). Smaller batches keep --lr: measured on 240 digit images
    (3 folds x 10 epochs, CPU), batch 8 at lr 1e-3 reached OOF accuracy 0.87, batch 8 at the
    sqrt-scaled 2.5e-4 only 0.40. The one LR rule: the start, the small-data shrink and the
    batch probe all apply it to --lr."""
    return lr * max(1.0, effective_batch / LR_REFERENCE_BATCH) ** 0.5


def image_size_for(profile: Profile, median_side: float | None) -> tuple[int, str]:
    """The image size for a profile and the training images' median side: the profile's default
    (224 on a GPU, 128 on CPU) is the ceiling; smaller images pull it down to their median side,
    rounded up to a multiple of 32 (28 px digits train at 32 px, not at 16x the compute of 128)."""
    ceiling = 224 if profile.is_gpu else 128
    if median_side is None:
        return ceiling, f"the {profile.name} profile's default"
    size = min(ceiling, max(32, 32 * -(-int(median_side) // 32)))
    return size, (
        f"the training images' median side is {median_side:g} px -> {size} px (up to a multiple of 32, "
        f"at most the {profile.name} profile's {ceiling})"
    )


# Segmentation: images are resized to a working size (their median side, up to a multiple of 32)
# and trained on tiles of it. 512 px tiles on a GPU (the usual Kaggle crop: context for a decoder
# at 1/32 resolution); 128 px on CPU, where a 512 px tile takes 16x a 128 px one's time.
SEGMENTATION_TILE = {"gpu": 512, "cpu": 128}
# A decoder keeps activations at up to full resolution for the backward: the bytes autograd saves
# for one step, relative to the classifier on the same encoder (measured on CPU at 256 px with
# saved_tensors_hooks, smp 0.6.0, the largest over tu-resnet18 / resnet34 / efficientnet_b0):
# Unet 2.2x, Unet++ 4.6x, FPN 1.4x, DeepLabV3+ 1.6x. The batch is divided by it. Detectors the
# same way (torchvision 0.29, resnet50 FPN at 512 px, 3 boxes an image): Faster R-CNN v2 1.85x,
# RetinaNet v2 1.32x, FCOS 1.31x; their floor is 2 images (1024 px scans on a 16 GB T4).
DECODER_ACTIVATIONS = {"unet": 2.2, "unetplusplus": 4.6, "fpn": 1.4, "deeplabv3plus": 1.6}
DECODER_ACTIVATIONS |= {"fasterrcnn": 1.85, "retinanet": 1.32, "fcos": 1.31}
DECODER_FLOOR = {"fasterrcnn": 2, "retinanet": 2, "fcos": 2}  # else MIN_DECODER_BATCH


SEGMENTATION_STRIDE = 32  # smp's encoders halve the input 5 times: every side a multiple of 32


def stride_problem(flag: str, value: int) -> str | None:
    """Why a segmentation size is refused (not a multiple of 32, with the nearest one below), or None."""
    if value % SEGMENTATION_STRIDE == 0:
        return None
    near = max(SEGMENTATION_STRIDE, value // SEGMENTATION_STRIDE * SEGMENTATION_STRIDE)
    return f"{flag} {value}: segmentation needs a multiple of {SEGMENTATION_STRIDE} ({near}?): the encoder halves it 5x"


def segmentation_work_size(median_side: float | None) -> tuple[int, str]:
    """The size every image is resized to: the training images' median side, up to a multiple of 32."""
    if median_side is None:
        return 256, "no training image read: 256 px"
    size = min(8192, max(32, 32 * -(-int(median_side) // 32)))
    return size, f"the training images' median side is {median_side:g} px -> {size} px (up to a multiple of 32)"


def segmentation_tile(profile: Profile, work_size: int) -> tuple[int, str]:
    """The training tile: the whole working size when it fits the profile's tile, else that tile."""
    cap = SEGMENTATION_TILE["gpu" if profile.is_gpu else "cpu"]
    if work_size <= cap:
        return work_size, f"whole {work_size} px images (within the {profile.name} profile's {cap} px tile)"
    return cap, (
        f"the {profile.name} profile's {cap} px tile of the {work_size} px images: random tiles in training, "
        f"overlapping by {cap // 4} px and stitched under a Gaussian window in validation and predict.py"
    )


def spectrogram_side(n_mels: int, samples: int, hop: int) -> int:
    """An audio window's spectrogram (n_mels x frames of a centred STFT) as the side of the square
    image of as many pixels, which the batch rule sizes activations by: 128 x 313 ~ 200 px."""
    return int(math.sqrt(n_mels * (samples // hop + 1)))


def fit_to_steps(batch: int, accum: int, rows: int) -> tuple[int, int]:
    """(batch, accumulation) giving an epoch of `rows` at least MIN_STEPS_PER_EPOCH optimizer
    steps: accumulation shrinks first, then the batch (a multiple of 8, at least 8)."""
    if rows // (batch * accum) >= MIN_STEPS_PER_EPOCH:
        return batch, accum
    effective = max(8, rows // MIN_STEPS_PER_EPOCH)
    if batch <= effective:
        return batch, max(1, effective // batch)
    return max(8, round_to(effective, 8)), 1


def round_batch(x: float) -> int:
    """Down to a multiple of 32 from 64 up (tensor-core and warp friendly), else of 8."""
    step = 32 if x >= 64 else 8
    return max(step, int(x // step) * step)


CPU_SHARE_ENV = "KAGTPL_CPU_SHARE"  # set by --parallel folds for its workers: the CPUs are split this many ways


def machine_cpus() -> int:
    """CPUs this machine lets us run on (a container's cgroup affinity, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS / Windows
        return os.cpu_count() or 1


def usable_cpus() -> int:
    """This process's share of them: split between torchrun's processes on this node
    (LOCAL_WORLD_SIZE) or --parallel folds' workers, so loader workers do not oversubscribe
    Kaggle's 4 vCPUs (2 trainers x 1 worker each, not 2 x 3)."""
    share = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get(CPU_SHARE_ENV) or 1)
    return max(1, machine_cpus() // share)


def loader_settings(cpus: int, on_cuda: bool) -> dict:
    """DataLoader settings: 8-12 workers where the CPUs exist, else CPUs minus one
    (3 on Kaggle's 4 vCPUs) so the main process keeps a core to feed the GPU."""
    workers = max(0, min(12, cpus - 1))
    return {
        "num_workers": workers,
        # 4 batches queued per worker when workers are few, 3 when many already overlap
        "prefetch_factor": (4 if workers <= 4 else 3) if workers else None,
        "persistent_workers": workers > 0,  # no worker respawn (and re-fork) every epoch
        "pin_memory": on_cuda,  # page-locked host memory: async host->GPU copies
    }


# Where the CPU itself trains, the rule gives no loader worker: one takes a core from torch's threads
# and passes every batch through shared memory. The demo's 1,500 digits on 2 cores (resnet10t, 32 px):
# 590-620 samples/s an epoch with none, 455-555 with one; 1.0 s of system time a run, not 3.3 s.
# The DataLoader line of a CPU run without workers says so (logs.resource_lines).
CPU_TRAINS = "the CPU trains: a loader worker would take a core from it; --workers N for N"


def rule_loader(cpus: int, device_type: str) -> dict:
    """The rule's loader settings on a `device_type` ("cuda", "cpu") with `cpus`: none where the
    CPU trains (CPU_TRAINS), else loader_settings'. kagtpl recommend and --workers -1 alike."""
    return loader_settings(1 if device_type == "cpu" else cpus, device_type == "cuda")


def flag_loader(workers: int, device_type: str) -> dict:
    """loader_settings for a script's --workers flag on a `device_type`: -1 = the rule (rule_loader
    on the usable CPUs), else that many."""
    on_cuda = device_type == "cuda"
    settings = rule_loader(usable_cpus(), device_type) if workers < 0 else loader_settings(workers + 1, on_cuda)
    if settings["num_workers"]:  # one folder for its workers' sockets, made before they fork
        from .loader_sockets import socket_dir

        socket_dir()
    return settings


@dataclass(frozen=True)
class Recommendation:
    batch_size: int
    aggressive_batch: int
    accum_steps: int
    amp: str
    channels_last: bool
    loader: dict
    model_class: str
    why: dict


def recommend(
    profile: Profile,
    model: str,
    image_size: int,
    cpus: int | None = None,
    batch_size: int = 0,
    decoder: str | None = None,
) -> Recommendation:
    """The settings for one GPU profile, model and resolution, each with its reason.
    batch_size > 0 keeps that batch (the user chose it) and derives the rest. decoder: a
    segmentation architecture (DECODER_ACTIVATIONS), whose activations shrink the batch."""
    cls = model_class(model)
    amp = amp_mode(profile.capability)
    cpus = profile.vcpus if cpus is None else cpus
    why = {}
    if batch_size > 0:
        batch, aggressive = batch_size, batch_size
        why["batch_size"] = "set by you"
    elif profile.is_gpu:
        mem = profile.memory_gb / ANCHOR_MEMORY_GB
        res = resolution_factor(image_size)
        mdl = 0.5 if cls == "heavy" else 1.0
        prec = 1.0 if amp in ("bf16", "fp16") else 0.5  # fp32 activations take twice the memory
        dec = DECODER_ACTIVATIONS[decoder] if decoder else 1.0
        raw = ANCHOR_BATCH * mem * res * mdl * prec / dec
        floor = DECODER_FLOOR.get(decoder, MIN_DECODER_BATCH) if decoder else MIN_GPU_BATCH
        batch = max(floor, round_batch(raw))
        aggressive = max(batch, min(round_batch(batch * 1.5), batch + 64))
        per_decoder = f" / {dec:g} for the {decoder} decoder's activations" if decoder else ""
        why["batch_size"] = (
            f"{ANCHOR_BATCH} (A10 24GB, 224px, AMP) x {mem:.2f} memory x {res:g} for {image_size}px"
            f" x {mdl:g} for a {cls} model x {prec:g} precision{per_decoder} = {raw:.0f} -> {batch}"
            f" (never below {floor} on a GPU); aggressive {aggressive}"
        )
    else:
        batch = aggressive = CPU_BATCH
        why["batch_size"] = f"CPU: {CPU_BATCH}; batch size does not buy speed without a GPU"
    target = (DECODER_EFFECTIVE_BATCH if decoder else TARGET_EFFECTIVE_BATCH) if profile.is_gpu else batch
    accum = max(1, round(target / batch))
    why["accum_steps"] = f"effective batch {batch * accum} (target {target}) = {batch} x {accum}"
    loader = rule_loader(cpus, "cuda" if profile.is_gpu else "cpu")
    why["num_workers"] = (
        f"min(12, CPUs - 1) with {cpus} CPUs; recomputed at run time from os.sched_getaffinity"
        if profile.is_gpu
        else CPU_TRAINS
    )
    why["prefetch_factor"] = "4 batches per worker with <= 4 workers, 3 with more; None with no workers"
    why["persistent_workers"] = "keep workers alive between epochs (no re-fork)"
    why["pin_memory"] = "on CUDA only: async host-to-GPU copies"
    cc = "none" if profile.capability is None else "{}.{}".format(*profile.capability)
    why["amp"] = {
        "bf16": f"compute capability {cc} >= 8.0: native bf16 autocast, no GradScaler",
        "fp16": f"compute capability {cc} (no native bf16): fp16 autocast + GradScaler",
        "fp32": f"compute capability {cc}: no tensor cores, fp32 (warns at run time)",
        "off": "CPU: no native bf16 here; autocast would only slow it down",
    }[amp]
    channels_last = profile.is_gpu and not any(p in model.lower() for p in ("vit", "deit", "swin", "eva", "beit"))
    why["channels_last"] = "CNN on CUDA: NHWC feeds tensor cores" if channels_last else "off: CPU or a transformer"
    return Recommendation(batch, aggressive, accum, amp, channels_last, loader, cls, why)


# Tables: batch 4096 on a GPU (field notes: tabular nets at 4096, >= 500 batches a minute);
# a small table gets a smaller power of two so an epoch still has MIN_TABULAR_STEPS steps.
TABULAR_GPU_BATCH, TABULAR_CPU_BATCH, MIN_TABULAR_STEPS, MIN_TABULAR_BATCH = 4096, 1024, 8, 16


def tabular_batch(profile: Profile, n_rows: int) -> int:
    cap = TABULAR_GPU_BATCH if profile.is_gpu else TABULAR_CPU_BATCH
    fit = max(MIN_TABULAR_BATCH, n_rows // MIN_TABULAR_STEPS)
    return max(MIN_TABULAR_BATCH, min(cap, 1 << (fit.bit_length() - 1)))


def tabular_batch_why(profile: Profile, n_rows: int) -> tuple[str, str]:
    """(VALIDATION's key, the detail): 'small-data' when the rows capped the batch (kept whatever the memory)."""
    cap, batch = TABULAR_GPU_BATCH if profile.is_gpu else TABULAR_CPU_BATCH, tabular_batch(profile, n_rows)
    detail = f"{'GPU' if profile.is_gpu else 'CPU'}: {cap}, capped at the power of two <= {n_rows} rows / "
    return ("small-data" if batch < cap else "rule"), f"{detail}{MIN_TABULAR_STEPS} steps -> {batch}"
