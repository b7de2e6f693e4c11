"""`python ARGS` for a shell script the tests run (benchmarks/gpu_smoke.sh's PYTHON): the script,
-m module or -c code runs through this pytest worker's fork server, as conftest.launch runs the
tests' own, on this process's stdin, stdout and stderr and in its folder and environment; this
process forwards SIGTERM, SIGINT and SIGHUP to it and ends as it did (its exit code, or its signal).
Anything else (`python -`, other options, another set of variables read at import than the
server's, no server named) is exec'd as the real interpreter. conftest.forkpython writes the
executable file that runs this."""

from __future__ import annotations

import json
import os
import signal
import sys

import forkserver


def main(argv: list[str]) -> None:
    path, key = os.environ.get("KAGTPL_TEST_FORKSERVER_SOCKET"), os.environ.get("KAGTPL_TEST_FORKSERVER_KEY")
    mine = {k: v for k, v in os.environ.items() if k != "PYTHON"}  # the shell script's own, read by no library
    runnable = argv and (argv[0] in ("-m", "-c") and len(argv) > 1 or not argv[0].startswith("-"))
    if not (path and runnable and key == json.dumps(forkserver.import_env(mine))):  # as conftest wrote it
        os.execv(sys.executable, [sys.executable, *argv])
    status = os.fdopen(forkserver.request(path, argv, os.getcwd(), dict(os.environ), (0, 1, 2), False), "rb", 0)
    pid = int(status.readline())
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _: os.kill(pid, s))
    line = status.readline()
    code = int(line) if line else -signal.SIGKILL
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
