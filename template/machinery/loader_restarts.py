"""A DataLoader whose pass outlives a killed worker. The OOM killer ends the process it frees most
by, often a loader worker (each holds its own batches in flight); a kill -9 does the same. torch then
stopped the whole script with a traceback: under run.py train.py "FAILED" with most of the budget
left, and a predict.py whose worker died handed in the fallback beside the trained folds.

A dead worker's batches never come. torch's iterator finds it within 5 s of waiting for one
(MP_STATUS_CHECK_INTERVAL) and raises `DataLoader worker (pid(s) N) exited unexpectedly` from the
loader's next(), where the pass can go on. torch's SIGCHLD handler raises the same error from
wherever the main thread is (an optimizer step, a checkpoint write), where nothing can go on: it is
not installed. It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import itertools
import re
import time

from torch.utils.data import DataLoader, Subset
from torch.utils.data._utils import signal_handling

# torch installs its SIGCHLD handler with a loader's first workers, once, unless this is already set
signal_handling._SIGCHLD_handler_set = True

DEATH = re.compile(r"DataLoader worker \(pid\(?s?\)? ?[\d, ]+\) (?:exited unexpectedly|is killed by signal: \w+)")


def worker_death(e: BaseException, batches) -> str | None:
    """What says a loader worker of the pass `batches` died: torch's RuntimeError, or a batch's
    handoff cut by the death (ConnectionResetError, EOFError: the worker's end of the socket closed
    before torch saw it gone), said with the dead worker's pid. None for any other error: a
    worker's own exception (a DataError in the dataset) comes through as itself."""
    if isinstance(e, RuntimeError):
        found = DEATH.search(str(e))
        return found.group(0) if found else None
    if not isinstance(e, (OSError, EOFError)) or "in DataLoader worker process" in str(e):
        return None
    dead = dead_workers(batches)
    return f"DataLoader worker (pid(s) {dead}) died as it handed over a batch ({type(e).__name__})" if dead else None


def dead_workers(batches, wait: float = 2.0) -> str:
    """The pids of the pass's workers that have ended (torch's iterator's own list), waiting up to
    `wait` s for a killed one to be gone: "" when every one is alive."""
    workers, deadline = getattr(batches, "_workers", []), time.monotonic() + wait
    while True:
        dead = [w.pid for w in workers if not w.is_alive()]
        if dead or time.monotonic() > deadline:
            return ", ".join(map(str, dead))
        time.sleep(0.05)


def halved(settings: dict) -> dict:
    """DataLoader settings with half the workers (3 -> 1 -> 0: the main process loads at 0)."""
    n = settings.get("num_workers", 0) // 2
    fewer = {**settings, "num_workers": n}
    if "persistent_workers" in settings:
        fewer["persistent_workers"] = bool(settings["persistent_workers"]) and n > 0
    if "prefetch_factor" in settings:
        fewer["prefetch_factor"] = settings["prefetch_factor"] if n else None
    return fewer


class RestartingLoader:
    """torch's DataLoader over `dataset` (`settings`: its keyword arguments) whose pass goes on when
    a worker dies, on half the workers from then on, with one WARNING line. An ordered pass (the
    validation rows, the test set, a cache's decode; a DDP sampler's order) goes on from the batch
    it stopped at, so every row is read once, in order; a shuffled one takes its remaining batches
    from a new shuffle. Another error is raised as it was."""

    def __init__(self, dataset, **settings):
        self.dataset, self.settings = dataset, settings
        self.loader = DataLoader(dataset, **settings)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str):  # batch_size, sampler, ...: the DataLoader's
        if name == "loader":  # not made yet (a copy, an unpickled one): no attribute, not a recursion
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __iter__(self):
        done, source, batches = 0, None, None
        while True:
            try:
                if batches is None:  # a persistent pool's start of a pass waits on every worker: a dead one too
                    source = batches = iter(self.loader)
                for batch in batches:
                    done += 1
                    yield batch
                return
            except (RuntimeError, OSError, EOFError) as e:
                pool = source if source is not None else getattr(self.loader, "_iterator", None)
                said = worker_death(e, pool) if self.settings.get("num_workers") else None
                if said is None:
                    raise
            source = batches = None  # the old pass's iterator: its live workers end with it
            source, batches = self.resume(said, done)

    def resume(self, said: str, done: int) -> tuple:
        """The rest of the pass after `done` batches, on half the workers, and the WARNING line:
        (torch's iterator, the batches to take from it)."""
        was, self.settings = self.settings.get("num_workers", 0), halved(self.settings)
        self.loader = DataLoader(self.dataset, **self.settings)  # later passes too
        total = len(self.loader)
        print(
            f"WARNING: {said} (killed: the OOM killer, or a kill -9): the pass goes on from batch {done + 1} of "
            f"{total} on {self.settings['num_workers']} loader worker(s), not {was}",
            flush=True,
        )
        if self.settings.get("shuffle"):
            source = iter(self.loader)
            return source, itertools.islice(source, max(total - done, 0))
        sampler = self.settings.get("sampler")
        order = list(sampler) if sampler is not None else range(len(self.dataset))
        rest = Subset(self.dataset, list(order[done * self.settings.get("batch_size", 1) :]))
        once = {k: v for k, v in self.settings.items() if k != "sampler"} | {"persistent_workers": False}
        source = iter(DataLoader(rest, **once))
        return source, source
