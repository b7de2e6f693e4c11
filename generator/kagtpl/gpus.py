"""`kagtpl gpus`: the GPU profiles of the template's hardware.py, with what each implies."""

from __future__ import annotations

from rich.table import Table

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
