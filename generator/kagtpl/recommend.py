"""`kagtpl gpus` and `kagtpl recommend`: the template's hardware rules, shown with reasons."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from kagtpl.errors import KagtplError
from kagtpl.template import hardware


def gpus_table() -> Table:
    hw = hardware()
    table = Table(title="GPU profiles (kagtpl new --gpu NAME)")
    for col in ("name", "GPU", "memory", "compute cap.", "native bf16", "AMP", "vCPUs", "note"):
        table.add_column(col)
    for p in hw.PROFILES.values():
        cap = "-" if p.capability is None else f"{p.capability[0]}.{p.capability[1]}"
        mem = "-" if not p.is_gpu else f"{p.gpus}x {p.memory_gb:g} GB" if p.gpus > 1 else f"{p.memory_gb:g} GB"
        table.add_row(
            p.name, p.label, mem, cap, "yes" if p.bf16_native else "no", hw.amp_mode(p.capability), str(p.vcpus), p.note
        )
    table.caption = "auto: detect the local GPU with nvidia-smi (cpu when there is none)"
    return table


def recommend_table(task: str, gpu: str, model: str | None, image_size: int, budget: str | None = None) -> Table:
    hw = hardware()
    if task not in ("image", "tabular"):
        raise KagtplError(f"unknown task {task!r}; valid tasks: image, tabular")
    if gpu not in hw.PROFILES:
        raise KagtplError(f"unknown GPU {gpu!r}; valid GPUs: {', '.join(hw.PROFILES)}")
    profile = hw.PROFILES[gpu]
    if task == "tabular":
        return tabular_table(profile, gpu, budget)
    model = model or ("resnet18" if gpu == "cpu" else "efficientnet_b4")
    rec = hw.recommend(profile, model, image_size)
    title = f"{task} on {profile.label} ({gpu}), {model} ({rec.model_class} model), {image_size} px"
    table = Table(title=title)
    table.add_column("setting")
    table.add_column("value")
    table.add_column("why")
    rows = [
        ("batch_size", rec.batch_size, rec.why["batch_size"]),
        ("accum_steps", rec.accum_steps, rec.why["accum_steps"]),
        ("num_workers", rec.loader["num_workers"], rec.why["num_workers"]),
        ("prefetch_factor", rec.loader["prefetch_factor"], rec.why["prefetch_factor"]),
        ("persistent_workers", rec.loader["persistent_workers"], rec.why["persistent_workers"]),
        ("pin_memory", rec.loader["pin_memory"], rec.why["pin_memory"]),
        ("AMP", rec.amp, rec.why["amp"]),
        ("channels_last", rec.channels_last, rec.why["channels_last"]),
    ]
    rows += budget_rows(gpu, budget)
    for name, value, why in rows:
        table.add_row(name, str(value), why)
    return table


def tabular_table(profile, gpu: str, budget: str | None) -> Table:
    hw = hardware()
    rec = hw.recommend(profile, "mlp", 224)
    table = Table(title=f"tabular on {profile.label} ({gpu}), an MLP with category embeddings")
    for col in ("setting", "value", "why"):
        table.add_column(col)
    rows = [
        (
            "batch_size",
            hw.tabular_batch(profile, 10**7),
            f"{hw.tabular_batch_why(profile, 10**7)}; a table of 5,000 rows: {hw.tabular_batch(profile, 5000)}",
        ),
        ("batching", "in memory", "the whole table as tensors on the device; batches are slices of a permutation"),
        ("num_workers", 0, "no per-row Dataset or collate: nothing to parallelise"),
        ("AMP", rec.amp, rec.why["amp"]),
        ("target speed", ">= 500 batches/min", "field notes: tabular nets at batch 4096"),
    ]
    for name, value, why in rows + budget_rows(gpu, budget):
        table.add_row(name, str(value), why)
    return table


def budget_rows(gpu: str, budget: str | None) -> list[tuple[str, str, str]]:
    """The default time plan: the budget, the prediction reserve and what training gets."""
    hw = hardware()
    if budget is None and gpu in hw.KAGGLE_PROFILES:
        budget = hw.KAGGLE_BUDGET
    try:
        seconds = hw.parse_duration(budget)
    except ValueError as e:
        raise KagtplError(f"--budget: {e}") from None
    if seconds is None:
        return [("budget", "none", "no time limit: nothing is cut (on Kaggle train.py uses 9h)")]
    reserve = 0.15 * seconds
    return [
        ("budget", budget, "wall time for train.py + predict.py together (python run.py --budget ...)"),
        ("reserve", f">= {reserve / 60:.1f} min", "15% of the budget, or the measured prediction estimate if larger"),
        (
            "training",
            f"<= {(seconds - reserve) / 60:.1f} min",
            "planned to 80%: cut folds 5->3, epochs by 30-50%, then 1 fold",
        ),
        ("plan", "5 folds x 10 epochs", "the defaults; estimated after the first steps, re-planned every epoch"),
    ]


def show(table: Table) -> None:
    Console(width=160).print(table)
