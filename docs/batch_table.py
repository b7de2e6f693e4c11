"""Print the batch-size table of docs/batch-and-workers.md from the template's own rules.

python docs/batch_table.py
"""

from kagtpl.template import hardware

hw = hardware()
cases = [
    ("resnet18", 224),
    ("efficientnet_b4", 224),
    ("efficientnet_b4", 384),
    ("efficientnet_b7", 224),
    ("efficientnet_b4", 512),
]
print("| profile | memory | AMP | " + " | ".join(f"{m} @{s}" for m, s in cases) + " | workers |")
print("|---" * (len(cases) + 4) + "|")
for p in hw.PROFILES.values():
    cells = []
    for model, size in cases:
        r = hw.recommend(p, model, size)
        cells.append(f"{r.batch_size} (x{r.accum_steps})" if r.accum_steps > 1 else str(r.batch_size))
    rec = hw.recommend(p, "efficientnet_b4", 224)
    mem = f"{p.memory_gb:g} GB" if p.is_gpu else "-"
    print(f"| {p.name} | {mem} | {rec.amp} | " + " | ".join(cells) + f" | {rec.loader['num_workers']} |")
