"""Durations: a --budget string read into seconds, seconds written for the log, and this
process's age. Pure Python, shared by run.py, train.py's planner and kagtpl's generator (through
planner.py, which imports these). It is machinery: `copier update` may replace it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

MAX_BUDGET_S = 30 * 86400  # a month: no competition runs longer


def parse_duration(text) -> float | None:
    """'9h', '45m', '600s', '1h30m' or plain seconds -> seconds; '' / None / 'none' -> None. A
    budget of no time ('0s', '00') or of more than MAX_BUDGET_S is a ValueError: run.py would start
    both scripts and stop them a second later, or hand predict.py a deadline past any clock's range."""
    if text is None or str(text).strip().lower() in ("", "none"):
        return None
    t = str(text).strip().lower()
    if re.fullmatch(r"\d+(\.\d+)?", t):
        seconds = float(t)
    else:
        parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", t)
        if not parts or "".join(n + u for n, u in parts) != t:
            raise ValueError(f"cannot read budget {text!r}: use e.g. 9h, 45m, 600s, 1h30m or plain seconds")
        seconds = sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)
    if not 1 <= seconds <= MAX_BUDGET_S:
        raise ValueError(
            f"budget {text!r} = {seconds:g}s: must be from 1s to {MAX_BUDGET_S // 86400} days (none: no budget)"
        )
    return seconds


def process_age() -> float:
    """Seconds since this process started (interpreter start and imports included); Linux only."""
    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 10.0


def fmt_s(seconds: float) -> str:
    if seconds >= 120:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"
