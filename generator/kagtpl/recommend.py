"""`kagtpl recommend`: the template's hardware and time-budget rules, shown with reasons."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from kagtpl import detect, paths
from kagtpl.errors import KagtplError
from kagtpl.template import adapters, hardware, planner, replanning, tasks, text_sizing


def recommend_table(
    task: str, gpu: str, model: str | None, image_size: int | None, budget: str | None = None, data: Path | None = None
) -> Table:
    hw = hardware()
    names = tasks().NAMES  # the template's task registry
    if task not in names:
        raise KagtplError(f"unknown task {task!r}; valid tasks: {', '.join(names)}")
    if task in ("detection", "audio"):  # their own tables: detection_table, audio_table (cli.recommend_cmd)
        raise KagtplError(f"no image or table rules for {task}: kagtpl recommend --task {task} gives its own table")
    if gpu not in hw.PROFILES:
        raise KagtplError(f"unknown GPU {gpu!r}; valid GPUs: {', '.join(hw.PROFILES)}")
    low, high = hw.RANGES["image_size"]
    if image_size is not None and not low <= image_size <= high:
        raise KagtplError(f"--image-size {image_size}: must be between {low} and {high}")
    profile = hw.PROFILES[gpu]
    if task == "tabular":
        return tabular_table(profile, gpu, budget)
    model = model or ("resnet18" if gpu == "cpu" else "efficientnet_b4")
    if image_size is not None:
        size_why = "set by you"
    elif data is not None:
        folder = paths.data_folder(data)
        image_size, size_why = detect.image_size(folder, detect.detect_image(folder, {}), profile)
    else:
        image_size, size_why = hw.image_size_for(profile, None)
    rec = hw.recommend(profile, model, image_size)
    title = f"{task} on {profile.label} ({gpu}), {model} ({rec.model_class} model), {image_size} px"
    table = Table(title=title)
    table.add_column("setting")
    table.add_column("value")
    table.add_column("why")
    rows = [
        ("image_size", image_size, size_why),
        ("batch_size", rec.batch_size, rec.why["batch_size"]),
        ("accum_steps", rec.accum_steps, rec.why["accum_steps"]),
        ("num_workers", rec.loader["num_workers"], rec.why["num_workers"]),
        ("prefetch_factor", rec.loader["prefetch_factor"], rec.why["prefetch_factor"]),
        ("persistent_workers", rec.loader["persistent_workers"], rec.why["persistent_workers"]),
        ("pin_memory", rec.loader["pin_memory"], rec.why["pin_memory"]),
        ("AMP", rec.amp, rec.why["amp"]),
        ("channels_last", rec.channels_last, rec.why["channels_last"]),
    ]
    rows += budget_rows(gpu, budget, "image")
    for name, value, why in rows:
        table.add_row(name, str(value), why)
    return table


def batch_rows(rec, profile, workers_note: str = "", amp_note: str = "") -> list[tuple]:
    """The batch, accumulation, loader-worker and AMP rows of a recommendation (hardware.recommend)
    for a task whose batch the probe refines on CUDA, each reason with the task's note added."""
    probe = "; the probe refines it on CUDA" if profile.is_gpu else ""
    return [
        ("batch_size", rec.batch_size, rec.why["batch_size"] + probe),
        ("accum_steps", rec.accum_steps, rec.why["accum_steps"]),
        ("num_workers", rec.loader["num_workers"], rec.why["num_workers"] + workers_note),
        ("AMP", rec.amp, rec.why["amp"] + amp_note),
    ]


def check_stride_size(hw, key: str, value: int | None) -> None:
    """A size a segmentation or detection network halves 5 times: in hardware.RANGES[key] and a
    multiple of 32 (hardware.stride_problem), else one KagtplError naming the flag."""
    if value is None:
        return
    flag, (low, high) = f"--{key.replace('_', '-')}", hw.RANGES[key]
    if not low <= value <= high:
        raise KagtplError(f"{flag} {value}: must be between {low} and {high}")
    problem = hw.stride_problem(flag, value)
    if problem:
        raise KagtplError(problem)


def segmentation_table(
    gpu: str,
    model: str | None,
    arch: str,
    tile: int | None,
    work_size: int | None,
    budget: str | None = None,
    data: Path | None = None,
) -> Table:
    """The working size, the tile, the batch for the decoder, AMP and the loader for a segmentation
    project on a profile, by the rules train.py applies (hardware.segmentation_tile, recommend with
    the decoder's activations)."""
    hw = hardware()
    if gpu not in hw.PROFILES:
        raise KagtplError(f"unknown GPU {gpu!r}; valid GPUs: {', '.join(hw.PROFILES)}")
    if arch not in hw.DECODER_ACTIVATIONS:
        raise KagtplError(f"unknown --arch {arch!r}; valid: {', '.join(hw.DECODER_ACTIVATIONS)}")
    for key, value in (("image_size", tile), ("work_size", work_size)):
        check_stride_size(hw, key, value)
    profile = hw.PROFILES[gpu]
    model = model or ("resnet18" if gpu == "cpu" else "resnet34")
    if work_size is not None:
        work_why = "set by you"
    elif data is not None:
        folder = paths.data_folder(data)
        layout = detect.detect_segmentation(folder, {})
        work_size, work_why = hw.segmentation_work_size(
            detect.median_side(folder / layout["train_dir"], layout["image_ext"])
        )
    else:
        work_size, work_why = hw.segmentation_work_size(None)
    tile, tile_why = (tile, "set by you") if tile is not None else hw.segmentation_tile(profile, work_size)
    rec = hw.recommend(profile, model, tile, decoder=arch)
    table = Table(title=f"segmentation on {profile.label} ({gpu}), {arch} on tu-{model}, {tile} px tiles")
    for col in ("setting", "value", "why"):
        table.add_column(col)
    rows = [
        ("work_size", work_size, work_why),
        ("image_size (tile)", tile, tile_why),
        *batch_rows(
            rec, profile, amp_note="; the loss is computed in fp32 from the probabilities" * (rec.amp != "off")
        ),
        ("channels_last", rec.channels_last, rec.why["channels_last"]),
        ("TTA", "horizontal flip", "predict.py averages each image and its flip; under a deadline TTA goes first"),
    ]
    for name, value, why in rows + budget_rows(gpu, budget, "segmentation"):
        table.add_row(name, str(value), why)
    return table


DETECTOR_WHY = {
    "fasterrcnn": "two stages: region proposals, then a box head per proposal; the GPU default, the strongest here",
    "retinanet": "one stage with focal loss: many small objects of few classes",
    "fcos": "one stage, one point per location (no anchor shapes); the CPU default, the lightest to train",
}


def detection_table(
    gpu: str,
    model: str | None,
    arch: str | None,
    image_size: int | None,
    budget: str | None = None,
    data: Path | None = None,
) -> Table:
    """The detector, the image size, the batch for the detector's activations, AMP and the loader
    for a detection project on a profile, by the rules kagtpl new and train.py apply
    (new.detection_size, hardware.recommend with the detector as decoder)."""
    from kagtpl import new

    hw = hardware()
    if gpu not in hw.PROFILES:
        raise KagtplError(f"unknown GPU {gpu!r}; valid GPUs: {', '.join(hw.PROFILES)}")
    profile = hw.PROFILES[gpu]
    arch = arch or ("fcos" if gpu == "cpu" else "fasterrcnn")
    if arch not in DETECTOR_WHY:
        raise KagtplError(f"unknown --arch {arch!r} for detection; valid: {', '.join(DETECTOR_WHY)}")
    check_stride_size(hw, "image_size", image_size)
    model = model or ("resnet18" if gpu == "cpu" else "resnet50")
    device = "gpu" if profile.is_gpu else "cpu"
    if image_size is not None:
        size_why = "set by you"
    elif data is not None:
        folder = paths.data_folder(data)
        layout = detect.detect_detection(folder, {})
        side = detect.median_side(folder / layout["train_dir"], layout["image_ext"])
        image_size, size_why = new.detection_side(side, device)
    else:
        image_size, size_why = new.detection_side(None, device)
    rec = hw.recommend(profile, model, image_size, decoder=arch)
    table = Table(title=f"detection on {profile.label} ({gpu}), {arch} on {model}, {image_size} px")
    for col in ("setting", "value", "why"):
        table.add_column(col)
    rows = [
        ("arch", arch, DETECTOR_WHY[arch]),
        ("image_size", image_size, size_why),
        ("anchors", "from the boxes", "train.py: the smallest anchor is the power of two under 10% of the box sides"),
        *batch_rows(rec, profile),
        (
            "TTA",
            "horizontal flip",
            "predict.py fuses folds and flips by weighted box fusion; under a deadline TTA goes first",
        ),
    ]
    for name, value, why in rows + budget_rows(gpu, budget, "detection"):
        table.add_row(name, str(value), why)
    return table


# An audio project's defaults, which its batch follows: copier.yml's sample_rate and window_seconds,
# train.py's --n-mels and --hop, smaller on CPU (tests/test_audio.py keeps them in step with the
# rendered project)
AUDIO_FRONT = {"sample_rate": 32000, "window_seconds": 5, "n_mels": 128, "hop": 512}
AUDIO_FRONT_CPU = {**AUDIO_FRONT, "n_mels": 64, "hop": 1024}


def audio_table(gpu: str, model: str | None, budget: str | None = None) -> Table:
    """The spectrogram, the batch for it, AMP, the loader and CPU inference for an audio project on
    a profile, by the rules train.py applies (hardware.spectrogram_side, hardware.recommend)."""
    hw = hardware()
    if gpu not in hw.PROFILES:
        raise KagtplError(f"unknown GPU {gpu!r}; valid GPUs: {', '.join(hw.PROFILES)}")
    profile, a = hw.PROFILES[gpu], AUDIO_FRONT_CPU if gpu == "cpu" else AUDIO_FRONT
    model = model or ("resnet10t" if gpu == "cpu" else "efficientnet_b0")  # copier.yml's default model
    samples = a["sample_rate"] * a["window_seconds"]
    side = hw.spectrogram_side(a["n_mels"], samples, a["hop"])
    rec = hw.recommend(profile, model, side)
    table = Table(title=f"audio on {profile.label} ({gpu}), {model} ({rec.model_class} model), log-mel spectrograms")
    for col in ("setting", "value", "why"):
        table.add_column(col)
    frames = samples // a["hop"] + 1
    rows = [
        (
            "spectrogram",
            f"{a['n_mels']} mels x {frames} frames",
            f"a {a['window_seconds']} s window at {a['sample_rate']} Hz, hop {a['hop']} (train.py --n-mels --hop); "
            f"batched like a {side} px image",
        ),
        *batch_rows(rec, profile, "; they crop the cached clips", "; the log-mel front end stays float32"),
        ("channels_last", rec.channels_last, rec.why["channels_last"]),
        (
            "CPU inference",
            "ONNX Runtime where installed",
            "predict.py --export auto runs each fold's CNN in ONNX Runtime on CPU, checked against torch first",
        ),
    ]
    for name, value, why in rows + budget_rows(gpu, budget, "audio"):
        table.add_row(name, str(value), why)
    return table


def tabular_table(profile, gpu: str, budget: str | None) -> Table:
    hw = hardware()
    rec = hw.recommend(profile, "mlp", 224)
    table = Table(title=f"tabular on {profile.label} ({gpu}): gradient-boosted trees and an MLP, blended")
    for col in ("setting", "value", "why"):
        table.add_column(col)
    rows = [
        (
            "batch_size",
            hw.tabular_batch(profile, 10**7),
            f"{hw.tabular_batch_why(profile, 10**7)[1]}; a table of 5,000 rows: {hw.tabular_batch(profile, 5000)}",
        ),
        (
            "models",
            "lgbm, xgb, cat, mlp",
            "--models auto: the installed boosters (xgb and cat on the GPU when there is one), then the MLP; "
            "predict.py blends them by hill climbing on their OOF predictions",
        ),
        ("batching", "in memory", "the whole table as tensors on the device; batches are slices of a permutation"),
        ("num_workers", 0, "no per-row Dataset or collate: nothing to parallelise"),
        ("AMP", rec.amp, rec.why["amp"]),
        ("target speed", ">= 500 batches/min", "field notes: tabular nets at batch 4096"),
    ]
    for name, value, why in rows + budget_rows(gpu, budget, "tabular"):
        table.add_row(name, str(value), why)
    return table


def text_table(
    gpu: str, model: str | None, max_len: int | None, budget: str | None, model_dir: Path | None = None
) -> Table:
    """max_len, batch, accumulation, AMP and checkpointing for a transformer on a profile, with
    the template's own rules (train.py then refines max_len from the token lengths and, on CUDA,
    the batch by the probe). With --model-dir the size is read from its config.json, and a
    decoder LLM gets LoRA, 4-bit and the batch from the memory model of adapters.py."""
    hw = hardware()
    if gpu not in hw.PROFILES:
        raise KagtplError(f"unknown GPU {gpu!r}; valid GPUs: {', '.join(hw.PROFILES)}")
    config = read_model_config(model_dir) if model_dir is not None else None
    model = model or (model_dir.name if model_dir is not None else "microsoft/deberta-v3-base")
    if config is not None:
        params_m, size_why = adapters().params_m(config), f"read from {model_dir / 'config.json'}"
    else:
        params_m, size_why = text_sizing().text_params(model)
    profile = hw.PROFILES[gpu]
    cap, cap_why = text_sizing().text_max_len_cap(profile)
    if max_len is None:
        max_len, len_why = cap, f"{cap_why}; train.py takes the 99th percentile of the token lengths below it"
    elif not 8 <= max_len <= 32768:
        raise KagtplError(f"--max-len {max_len}: must be between 8 and 32768")
    else:
        len_why = "set by you"
    rec = hw.recommend(profile, model, 224)  # the one AMP rule, with its reason
    amp, amp_why = rec.amp, rec.why["amp"]
    if "mdeberta" in model.lower() and amp == "fp16":
        amp, amp_why = "fp32", "mDeBERTa overflows in fp16 and this GPU has no bf16"
    size = f"{params_m / 1000:.1f}B" if params_m >= 1000 else f"{params_m:.0f}M"
    table = Table(title=f"text on {profile.label} ({gpu}), {model} ({size} params: {size_why})")
    for col in ("setting", "value", "why"):
        table.add_column(col)
    if config is not None and adapters().is_decoder(config):
        rows = llm_rows(config, profile, max_len, len_why)
    else:
        rows = encoder_rows(profile, params_m, max_len, len_why)
    rows.insert(-2, ("AMP", amp, amp_why))
    for name, value, why in rows + budget_rows(gpu, budget, "text"):
        table.add_row(name, str(value), why)
    return table


def read_model_config(model_dir: Path) -> dict:
    """A Hugging Face folder's config.json: the weights are not needed to size the model."""
    import json

    path = model_dir / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise KagtplError(f"--model-dir {model_dir}: no readable config.json ({type(e).__name__})") from None
    if not isinstance(config, dict) or not config.get("model_type"):
        raise KagtplError(f"--model-dir {model_dir}: {path.name} has no model_type: not a Hugging Face config")
    return config


def encoder_rows(profile, params_m: float, max_len: int, len_why: str) -> list[tuple]:
    batch, accum, batch_why = text_sizing().text_batch(profile, params_m, max_len)
    checkpointing, ckpt_why = text_sizing().text_checkpointing(profile, params_m)
    return [
        ("max_len", max_len, len_why),
        ("batch_size", batch, batch_why + ("; the probe refines it on CUDA" if profile.is_gpu else "")),
        ("accum_steps", accum, f"to an effective batch of {batch * accum}"),
        ("grad_checkpointing", "on" if checkpointing else "off", ckpt_why),
        ("LoRA", "off", "an encoder: full fine-tuning fits and scores best; --lora on trains adapters only"),
        ("padding", "dynamic", "each batch padded to its own longest text; training batches grouped by length"),
        ("num_workers", 0, "token ids are cached; padding a batch is a numpy copy"),
    ]


def llm_rows(config: dict, profile, max_len: int, len_why: str) -> list[tuple]:
    """A decoder LLM: LoRA always; 4-bit where the 16-bit weights leave no room for a batch of 4
    (or on a card without 16-bit room at all); the batch and checkpointing from the memory model."""
    ad, sizing = adapters(), text_sizing()
    r, memory = ad.LORA_R, profile.memory_gb
    full = ad.params_m(config) * 16 / 1024  # GB: weights, gradients and AdamW for full fine-tuning
    lora_m = ad.lora_params_m(config, r)
    w16 = ad.memory_gb(config, "16bit", r, max_len, True)["weights"]
    w4 = ad.memory_gb(config, "4bit", r, max_len, True)["weights"]
    if profile.is_gpu:
        sixteen = ad.lora_fit(config, memory, "none", r, max_len)
        quant = "none" if sixteen[0] >= 4 and not sixteen[1] else "4bit"
        batch, checkpointing, parts, fit_why = ad.lora_fit(config, memory, quant, r, max_len)
        accum = max(1, sizing.TEXT_TARGET_EFFECTIVE_BATCH // batch)
        quant_why = (
            f"16-bit weights ({w16:.1f} GB) leave room for a batch of {sixteen[0]}"
            if quant == "none"
            else f"16-bit weights take {w16:.1f} GB of {memory:g}; NF4 + double quantisation {w4:.1f} GB (QLoRA; "
            "needs CUDA and bitsandbytes)"
        )
    else:  # CPU: fp32 weights, the CPU batch rule; fine for a tiny model's smoke test only
        batch, accum, _ = sizing.text_batch(profile, ad.params_m(config), max_len)
        checkpointing, quant, quant_why = False, "none", "4-bit kernels need CUDA: fp32 weights on CPU"
        parts = ad.memory_gb(config, "32bit", r, batch * max_len, False)
        fit_why = f"{ad.memory_line(parts)} of CPU RAM at batch {batch}"
    return [
        ("max_len", max_len, len_why),
        (
            "LoRA",
            f"r {r}, alpha {ad.LORA_ALPHA}, {ad.LORA_TARGETS}",
            f"full fine-tuning needs ~{full:.0f} GB (16 bytes a parameter); the adapters train {lora_m:.1f}M "
            f"({lora_m / ad.params_m(config):.2%}), the head fully; lr {ad.LORA_LR:g}",
        ),
        ("quant", quant, quant_why),
        ("memory", f"{parts['total']:.1f} GB", fit_why),
        ("batch_size", batch, "the largest power of two that fits; the probe refines it on CUDA"),
        ("accum_steps", accum, f"to an effective batch of {batch * accum}"),
        ("grad_checkpointing", "on" if checkpointing else "off", "on only where a batch of 4 does not fit without"),
        ("checkpoint", f"~{lora_m * 4:.0f} MB a fold", "the adapters and head in fp32, not the base model"),
        ("padding", "dynamic", "right padding; the score is read at the last real token"),
    ]


def budget_rows(gpu: str, budget: str | None, task: str = "image") -> list[tuple[str, str, str]]:
    """The default time plan: the budget, the prediction reserve and what training gets, from the
    template's own planner (planner.py), so these figures are the ones train.py will use."""
    hw, plan = hardware(), planner()
    if budget is None and gpu in hw.KAGGLE_PROFILES:
        budget = plan.KAGGLE_BUDGET
    try:
        seconds = plan.parse_duration(budget)
    except ValueError as e:
        raise KagtplError(f"--budget: {e}") from None
    if seconds is None:
        return [("budget", "none", f"no time limit: nothing is cut (on Kaggle train.py uses {plan.KAGGLE_BUDGET})")]
    kept = plan.PredictionReserve
    reserve = kept.FRACTION * seconds
    folds, epochs = plan.DEFAULT_PLAN[task]
    return [
        ("budget", budget, "wall time for train.py + predict.py together (python run.py --budget ...)"),
        (
            "reserve",
            f">= {reserve / 60:.1f} min",
            f"{kept.FRACTION:.0%} of the budget until predict.py's time is measured, then "
            f"{kept.MEASURED_FRACTION:.0%}, or the measured prediction estimate if larger",
        ),
        (
            "training",
            f"<= {(seconds - reserve - plan.FINISH_S) / 60:.1f} min",
            f"planned to {replanning().PLAN_FRACTION:.0%}: cut folds {folds}->3, epochs by 30-50%, then 1 fold",
        ),
        (
            "plan",
            f"{folds} folds x {epochs} epochs",
            "the defaults; estimated after the first steps, re-planned every epoch",
        ),
    ]
