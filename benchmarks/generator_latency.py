"""Generator latency: `kagtpl new` against a raw `copier copy` of the same template with the
same answers, as whole commands (interpreter start included), interleaved, median of rounds.

    python benchmarks/generator_latency.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _project import work_dir

ROOT = Path(__file__).resolve().parents[1]


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    answers = {"task": "image", "gpu": "a10", "model": "efficientnet_b4"}
    kagtpl_times, copier_times = [], []
    for r in range(args.rounds):
        dest = work_dir("kagtpl-bench-gen-")
        kagtpl_times.append(
            timed(
                [
                    sys.executable,
                    "-m",
                    "kagtpl",
                    "new",
                    f"k{r}",
                    "--dest",
                    str(dest),
                    *[f"--{k.replace('_', '-')}={v}" for k, v in answers.items()],
                ]
            )
        )
        data = [f"--data={k}={v}" for k, v in {"project_name": f"c{r}", **answers}.items()]
        copier_times.append(
            timed(
                [
                    sys.executable,
                    "-m",
                    "copier",
                    "copy",
                    "--defaults",
                    "--quiet",
                    "--vcs-ref=HEAD",
                    *data,
                    str(ROOT),
                    str(dest / f"c{r}"),
                ]
            )
        )
    k, c = statistics.median(kagtpl_times), statistics.median(copier_times)
    print(f"generator latency, whole commands, median of {args.rounds} interleaved rounds")
    print(f"{'':22}{'seconds':>9}")
    print(f"{'kagtpl new':22}{k:9.2f}")
    print(f"{'copier copy':22}{c:9.2f}")
    print(f"ratio kagtpl / copier: {k / c:.2f}x")


if __name__ == "__main__":
    main()
