"""The training report picture: loss and metric per epoch per fold, and GPU memory % per epoch
with the decision matrix's 50/70/90% bands. Pure matplotlib (no torch): kagtpl's `doctor --plot`
draws the same picture from a log. Machinery: `copier update` may replace this file."""

from __future__ import annotations

from pathlib import Path

from .storage import atomic_write


def plot(records: list[dict], path: Path, title: str = "training") -> Path:
    """records: one dict per epoch with fold, epoch, train_loss, val_loss, metric, gpu_pct (any may be missing)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_metric, ax_mem) = plt.subplots(1, 3, figsize=(15, 4.2))
    folds = sorted({r.get("fold", 0) for r in records})
    for k, fold in enumerate(folds):
        rows = [r for r in records if r.get("fold", 0) == fold]
        epochs, color = [r["epoch"] for r in rows], f"C{k % 10}"
        for key, style in (("train_loss", "-"), ("val_loss", "--")):
            if all(r.get(key) is not None for r in rows):
                label = f"fold {fold} {key.split('_')[0]}"
                ax_loss.plot(epochs, [r[key] for r in rows], style, marker="o", ms=3, color=color, label=label)
        if all(r.get("metric") is not None for r in rows):
            ax_metric.plot(epochs, [r["metric"] for r in rows], marker="o", ms=3, color=color, label=f"fold {fold}")
        if all(r.get("gpu_pct") is not None for r in rows):
            ax_mem.plot(epochs, [r["gpu_pct"] for r in rows], marker="o", color=color, label=f"fold {fold}")
    name = next((r.get("metric_name") for r in records if r.get("metric_name")), "metric")
    ax_loss.set(title="loss", xlabel="epoch")
    ax_metric.set(title=name, xlabel="epoch")
    ax_mem.set(title="GPU memory (peak %)", xlabel="epoch", ylim=(0, 100))
    ax_mem.axhspan(0, 50, color="red", alpha=0.08, label="< 50%: double the batch")
    ax_mem.axhspan(70, 90, color="green", alpha=0.10, label="70-90%: optimal")
    for level in (50, 70, 90):
        ax_mem.axhline(level, color="grey", lw=0.8, ls=":")
    if not any(r.get("gpu_pct") is not None for r in records):
        ax_mem.text(0.5, 0.5, "no GPU (CPU run)", ha="center", va="center", transform=ax_mem.transAxes)
    for ax in (ax_loss, ax_metric, ax_mem):
        ax.xaxis.get_major_locator().set_params(integer=True)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    # tight_layout's margins, fixed (6-digit tick labels fit): it drew the figure once more, 0.08 s of 0.21
    fig.subplots_adjust(left=0.045, right=0.99, bottom=0.12, top=0.86, wspace=0.18)
    path = Path(path)
    try:  # a full disk: atomic_write's RunError, its part removed
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=90))
    finally:
        plt.close(fig)
    return path
