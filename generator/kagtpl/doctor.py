"""`kagtpl doctor [LOG]`: the GPU decision matrix applied to any training log with the field
notes' print formats (RESOURCES:, GPU Memory Used:, Epoch N: ... GPU=xGB (y%)), ours included:
a project's output/train.log (train.py writes it beside its stdout, the default) or its JSON
log output/train_log.jsonl (the last run in it)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kagtpl import paths
from kagtpl.errors import KagtplError
from kagtpl.template import hardware, profiles, template_module

RESOURCES = re.compile(r"RESOURCES: (\d+) CPU cores, batch=(\d+), GPU=(.+?), Mixed Precision=(ON|OFF)")
TOTAL = re.compile(r"^GPU Memory: ([\d.]+) GB")
LOADER = re.compile(r"DataLoader: num_workers=(\d+), prefetch_factor=(\w+), persistent_workers=(\w+)")
MODEL = re.compile(r"^Model: (.+)$")
USED = re.compile(r"GPU Memory Used: ([\d.]+) GB / ([\d.]+) GB \(([\d.]+)%\)")
EPOCH = re.compile(r"^Epoch (\d+): (.*?)GPU=([\d.]+)GB \(([\d.]+)%\)")
FOLD = re.compile(r"^FOLD (\d+) \(")
LOSS = re.compile(r"\bLoss=([\d.]+)")
VAL_LOSS = re.compile(r"ValLoss=([\d.]+)")
METRIC = re.compile(r", ([A-Za-z]+)=([\d.]+), LR=")
THROUGHPUT = re.compile(r"Throughput=([\d.]+) samples/s")
BATCH = re.compile(
    r"^BATCH: (\d+) (?:per GPU x \d+ GPUs )?x \d+ accumulation.*?(?:\((small data: .*?)(?:; lr [^)]*)?\))?$"
)
PROBED = re.compile(r"^BATCH PROBE: batch \d+ x \d+ -> (\d+) x \d+ \((.*)\)")  # the probe's choice
OOM = re.compile(r"^OOM: .* micro-batch \d+ -> (\d+)")  # a step that did not fit: the micro-batch halves
# the batch judged with its reason (rule, user, small-data, probe, oom): the engine's own choices are kept
VALIDATION = re.compile(r"^VALIDATION: batch_size=(\d+), [\d.]+% of GPU memory, set by ([\w-]+) \((.*)\): ")
CHOSEN = ("small-data", "probe", "oom")  # set on purpose: a memory share under the target is headroom, not waste
# a run short of disk (the project's caches.py, storage.atomic_write, growth.disk_room): said, and acted on
DISK = ("too little disk (", ": the disk is full (", "(the disk has ", "CLEANUP: the disk refused ")
# the run judged its folds worse than train.py's fallback on their OOF rows (the project's hand_in.py): handed in
HAND_IN = "HAND-IN: the fallback: "
DEFAULT_LOGS = ("output/train.log", "output/train_log.jsonl")  # what a project's train.py writes
TASK_SPEED = {"image": 100, "tabular": 500}  # batches per minute the field notes expect


@dataclass
class Log:
    """What a training log says, line by line: the raw material for a report and a plot."""

    cpus: int | None = None
    batch: int | None = None
    gpu: str | None = None
    amp: str | None = None
    total_gb: float | None = None
    workers: int | None = None
    prefetch: int | None = None
    persistent: bool | None = None
    model: str | None = None
    size_class: str | None = None
    first_step_pct: float | None = None
    epochs: list[dict] = field(default_factory=list)
    tabular: bool = False
    cpu_run: bool = False  # "GPU Memory Used: none (CPU run)"
    set_by: str | None = None  # why the batch is what it is (the VALIDATION line's key), when the log says
    set_why: str = ""
    skipped: int = 0  # the JSON log's lines that are not JSON: a record cut short (a full disk, a kill)
    disk: list[str] = field(default_factory=list)  # the lines that say the disk was short (DISK)
    fallback: str | None = None  # the HAND-IN line's verdict: the folds lost to train.py's fallback


def parse(text: str) -> Log:
    log, fold = Log(), 0
    for line in text.splitlines():
        line = line.strip()
        if any(words in line for words in DISK):
            log.disk.append(line)
        if line.startswith(HAND_IN):
            log.fallback = line.removeprefix(HAND_IN)
        if m := RESOURCES.search(line):
            log.cpus, log.batch, log.gpu, log.amp = int(m[1]), int(m[2]), m[3], m[4]
        elif m := VALIDATION.match(line):
            log.batch, log.set_by, log.set_why = int(m[1]), m[2], m[3]
        elif m := OOM.match(line):  # mid-run: the micro-batch halved, and stays so
            log.batch, log.set_by, log.set_why = int(m[1]), "oom", "a step ran out of memory: the micro-batch halved"
        elif m := BATCH.match(line):  # the batch the run ended with is the last one
            log.batch = int(m[1])
            if m[2]:  # logs before 0.7 (VALIDATION without `set by`) say the small-data floor only here
                log.set_by, log.set_why = "small-data", m[2].removeprefix("small data: ")
        elif m := PROBED.match(line):
            log.batch, log.set_by, log.set_why = int(m[1]), "probe", m[2]
        elif m := TOTAL.search(line):
            log.total_gb = float(m[1])
        elif m := LOADER.search(line):
            log.workers, log.persistent = int(m[1]), m[3] == "True"
            log.prefetch = int(m[2]) if m[2].isdigit() else None
            log.tabular = "in-memory batching" in line
        elif m := MODEL.match(line):
            log.model, log.size_class = model_class(m[1])
        elif line.startswith("GPU Memory Used: none"):
            log.cpu_run = True
        elif m := USED.search(line):
            log.first_step_pct = float(m[3])
            log.total_gb = log.total_gb or float(m[2])
        elif m := FOLD.match(line):
            fold = int(m[1])
        elif m := EPOCH.match(line):
            record = {"fold": fold, "epoch": int(m[1]), "gpu_used_gb": float(m[3]), "gpu_pct": float(m[4])}
            for key, pattern in (("train_loss", LOSS), ("val_loss", VAL_LOSS), ("samples_per_s", THROUGHPUT)):
                if v := pattern.search(line):
                    record[key] = float(v[1])
            if v := METRIC.search(line):
                record["metric"], record["metric_name"] = float(v[2]), v[1]
            log.epochs.append(record)
    return log


def parse_records(text: str) -> Log:
    """The JSON log (train_log.jsonl): the last run's epoch records. It holds no RESOURCES or
    Model line, so the GPU, the model and the loader are unknown (--model names the model). A
    line that is not JSON (a record cut short: the next run's records start on a line of their
    own) is skipped, and a WARNING says so; a file with no JSON line at all is an error."""
    records, torn = template_module("logs").json_lines(text)  # the project's own reader
    bad = [f"line {n} of the JSON log is not JSON ({why})" for n, why in torn]
    if bad and not records:  # not a JSON log at all
        raise KagtplError(bad[0])
    last = records[-1].get("run") if records else None
    epochs = [r for r in records if r.get("run") == last and "epoch" in r]
    if not epochs:
        raise KagtplError("the JSON log has no epoch records")
    log = Log(batch=epochs[-1].get("batch_size"), epochs=[r for r in epochs if r.get("gpu_pct") is not None])
    log.set_by = epochs[-1].get("batch_set_by")
    log.set_why = "the JSON log's batch_set_by" if log.set_by else ""
    log.cpu_run, log.skipped = not log.epochs, len(bad)
    return log


def model_class(text: str) -> tuple[str, str | None]:
    """('efficientnet_b4', 'large') from 'efficientnet_b4 (17.6M params, large model)' or 'EfficientNet-B4'."""
    stated = re.search(r"\b(small|large) model\)", text)
    name = text.split(" (")[0].strip()
    key = name.lower().replace("-", "_").replace(" ", "_")
    if stated:
        return name, stated[1]
    words = set(re.split(r"[\W_]+", name.lower()))
    if words & {"small", "tiny", "mini", "simple"}:
        return name, "small"
    known = any(p in key for p in (*hardware().SMALL_PATTERNS, *hardware().LARGE_PATTERNS, *hardware().HEAVY_PATTERNS))
    return name, hardware().size_class(key) if known else None


@dataclass
class Report:
    model: str | None
    size_class: str
    gpu: str | None
    total_gb: float | None
    batch: int | None
    memory_pct: float | None
    trend: str
    row: str
    action: str
    new_batch: int | None
    optional: bool
    loader_advice: list[str]
    warnings: list[str]
    status: str  # "ok" | "action"
    disk: list[str] = field(default_factory=list)  # DISK: lines, each an action
    hand_in: list[str] = field(default_factory=list)  # HAND-IN: lines, an action: the fallback was handed in

    def lines(self) -> list[str]:
        out = [
            f"MODEL: {self.model or 'unknown'} ({self.size_class} model: the target is "
            f"{'50-60%' if self.size_class == 'small' else '70% or more'} of GPU memory)",
            f"GPU: {self.gpu or 'unknown'}, {self.total_gb or '?'} GB, batch {self.batch or '?'}",
            f"MEMORY: {self.trend}",
            f"DECISION: {self.row}: {self.action}",
        ]
        out += [f"LOADER: {a}" for a in self.loader_advice]
        out += [f"DISK: {d}" for d in self.disk]
        out += [f"HAND-IN: {h}" for h in self.hand_in]
        out += [f"WARNING: {w}" for w in self.warnings]
        out.append(f"STATUS: {'OK' if self.status == 'ok' else 'ACTION NEEDED'}")
        return out


def diagnose(log: Log, model: str | None = None) -> Report:
    hw = hardware()
    name, cls = log.model, log.size_class
    if model:
        name, cls = model, hw.size_class(model)
    cls = cls or "large"  # unknown: hold it to the stricter target
    points = [e["gpu_pct"] for e in log.epochs]
    pct = points[-1] if points else log.first_step_pct
    if pct is None and (log.gpu == "none" or log.cpu_run):
        return cpu_report(log, name, cls)
    if pct is None:
        raise KagtplError("the log has no GPU memory line (GPU Memory Used: ... or Epoch N: ... GPU=xGB (y%))")
    decision = profiles().memory_decision(pct, cls)
    new_batch, needed, action = None, decision.needed, decision.action
    if decision.factor > 1 and log.set_by in CHOSEN:  # the engine's choice: growing it is wrong, not missed
        needed = False
        action = f"keep batch {log.batch}: set by {log.set_by} ({log.set_why}); the memory left is headroom"
    elif decision.factor > 1 and log.batch:
        new_batch = hw.round_batch(log.batch * decision.factor)
        action += f": batch {log.batch} -> {new_batch}"
    warnings = [w for a, b in zip(points, points[1:], strict=False) if (w := profiles().memory_drop_warning(a, b))]
    warnings += skipped_lines(log)
    report = Report(
        name,
        cls,
        log.gpu,
        log.total_gb,
        log.batch,
        pct,
        trend(log, points),
        decision.row,
        action,
        new_batch,
        decision.optional and new_batch is not None,
        loader_advice(log),
        warnings,
        "action" if needed or loader_advice(log) else "ok",
    )
    return with_hand_in(with_disk(report, log), log)


def with_disk(report: Report, log: Log) -> Report:
    """The report with a DISK: line when the run was short of disk (a cache held in memory, a file
    the disk refused, growth stopped by it): the first such line and the way out, an action."""
    if not log.disk:
        return report
    more = f" (and {len(log.disk) - 1} more such line(s))" if len(log.disk) > 1 else ""
    first = next((line for line in log.disk if line.startswith("ERROR:")), log.disk[0])  # what stopped it, if any
    report.disk = [
        f"the run was short of disk{more}: {first}",
        "free space on the disk --out-dir is on (old runs' checkpoints, output/cache/ of other sizes), "
        "or pass --out-dir on a larger disk",
    ]
    report.status = "action"
    return report


def with_hand_in(report: Report, log: Log) -> Report:
    """The report with HAND-IN: lines when the run judged its folds worse than train.py's fallback
    on their OOF rows, so predict.py hands in the fallback: the verdict and the way out, an action
    (a run at the right batch is not a run that is fine)."""
    if log.fallback is None:
        return report
    report.hand_in = [
        f"the run hands in train.py's fallback, not its folds: {log.fallback}",
        "train longer (a larger run.py --budget, more --epochs) or check the learning rate and the labels, then "
        "train again; --hand-in folds hands these folds in anyway",
    ]
    report.status = "action"
    return report


def cpu_report(log: Log, name: str | None, cls: str) -> Report:
    """A CPU run (GPU=none, `GPU Memory Used: none (CPU run)`): nothing to size; said, exit 0."""
    report = Report(
        name,
        cls,
        "none (CPU run)",
        None,
        log.batch,
        None,
        "CPU run: no GPU memory to check",
        "CPU run",
        "nothing to size here; on a GPU, kagtpl recommend --gpu <profile> gives the batch, then run doctor on that log",
        None,
        False,
        [],
        skipped_lines(log),
        "ok",
    )
    return with_hand_in(with_disk(report, log), log)


def skipped_lines(log: Log) -> list[str]:
    if not log.skipped:
        return []
    cut = "a record cut short by a full disk or a kill"
    return [f"{log.skipped} line(s) of the JSON log are not JSON ({cut}): skipped"]


def trend(log: Log, points: list[float]) -> str:
    if not points:
        return f"{log.first_step_pct:.1f}% after the first step (no epoch lines yet)"
    shape = "stable"
    if points[-1] - points[0] > 5:
        shape = "rising"
    elif points[0] - points[-1] > 5:
        shape = "falling"
    return (
        f"{len(points)} epoch lines, first {points[0]:.1f}%, last {points[-1]:.1f}%, "
        f"min {min(points):.1f}%, max {max(points):.1f}% ({shape})"
    )


def loader_advice(log: Log) -> list[str]:
    """Input-bound signs: fewer workers than the rule, shallow prefetch, re-forked workers, or
    fewer batches a minute than the field notes expect."""
    if log.tabular or log.cpus is None:
        return []
    advice = []
    want = hardware().loader_settings(log.cpus, True)
    enough = min(8, want["num_workers"])  # the field notes' 8-12; all but one core on small machines
    if log.workers is not None and log.workers < enough:
        advice.append(
            f"num_workers={log.workers} with {log.cpus} CPUs: use {want['num_workers']} "
            "(min(12, CPUs - 1)) so the GPU does not wait on JPEG decoding"
        )
    if log.workers and log.prefetch is not None and log.prefetch < 3:
        advice.append(f"prefetch_factor={log.prefetch}: use 3-4 batches per worker")
    if log.workers and log.persistent is False:
        advice.append("persistent_workers=False: set True (no worker re-fork every epoch)")
    speeds = [e["samples_per_s"] for e in log.epochs if "samples_per_s" in e]
    if speeds and log.batch and log.gpu not in (None, "none"):
        per_min = 60 * speeds[-1] / log.batch
        if per_min < TASK_SPEED["image"]:
            advice.append(
                f"{per_min:.0f} batches/min is below the field notes' {TASK_SPEED['image']}/min for images: "
                "likely input-bound (decode cache, more workers, smaller images on disk)"
            )
    return advice


def find_log(path: Path | None) -> Path:
    """The log given, or the project's own in the current folder (DEFAULT_LOGS, in that order)."""
    if path is None:
        found = next((Path(p) for p in DEFAULT_LOGS if Path(p).is_file()), None)
        if found is None:
            # runs written elsewhere (train.py --out-dir exp1, a dry run's output/dry-run): the commands for them
            others = hardware().run_files(Path(), "train.log")[:3]
            way = "; ".join(f"kagtpl doctor {paths.shell(p)}" for p in others) or "run it in a project after train.py"
            raise KagtplError(f"no LOG given and no {' or '.join(DEFAULT_LOGS)} here: {way}, or pass a log's path")
        return found
    if not path.is_file():
        raise KagtplError(f"{path}: no such log file")
    return path


# run.py's RUN lines and predict.py's (run.log, predict.log beside train.log): logs with none of train.py's
OTHER_WORDS = ("RUN", "PREDICT", "ENSEMBLE", "SUBMISSION")
TRAIN_WORDS = ("RESOURCES", "BATCH", "FOLD", "Epoch", "DONE", "STOPPED", "DRY RUN", "PARALLEL", "COMPILE")


def check_train_log(path: Path, text: str) -> None:
    """A log of run.py's or predict.py's lines alone (run.log, predict.log) is named as such, with
    train.py's beside it: the doctor reads training, and said "no GPU memory line" there. A console
    that holds all three scripts' lines (nohup.out) is train.py's too."""
    firsts = {line.split(":")[0] for line in text.splitlines()}
    if any(w.startswith(TRAIN_WORDS) for w in firsts) or not any(w.startswith(OTHER_WORDS) for w in firsts):
        return
    who = "run.py" if any(w.startswith("RUN") for w in firsts) else "predict.py"
    raise KagtplError(f"{path} is {who}'s log, not train.py's: kagtpl doctor {paths.shell(path.parent / 'train.log')}")


def run(path: Path | None, model: str | None, as_json: bool, plot: Path | None) -> int:
    path = find_log(path)
    text = path.read_text(errors="replace")
    check_train_log(path, text)
    log = parse_records(text) if path.suffix == ".jsonl" else parse(text)
    report = diagnose(log, model)
    if plot is not None:
        draw(log, plot)
    if as_json:
        print(json.dumps(asdict(report), indent=2))
    else:
        print("\n".join(report.lines()))
    return 0 if report.status == "ok" else 1


def draw(log: Log, path: Path) -> None:
    if not log.epochs:
        raise KagtplError("the log has no Epoch lines to plot")
    try:
        module = template_module("report")
        module.plot(log.epochs, path, title=f"{log.model or 'model'} on {log.gpu or 'GPU'}")
    except ImportError as e:
        raise KagtplError(f"--plot needs matplotlib: pip install matplotlib ({e})") from e
