"""The gateway's own process: python -m kaggle_evaluation.core.gateway_process MODULE CLASS DATA_PATHS_JSON.

It ends by os._exit once its streams are flushed, without the interpreter's teardown, as the generated
scripts end (machinery/errors.end_now): the gateway reads every answer with pd.read_parquet, and Arrow's
thread pool, torn down at a process's exit, can abort it after its work is done (`terminate called
without an active exception`, SIGABRT: apache/arrow issue 34314). A full suite saw it once, after the
gateway had every answer (test_serve's text project, 2026-12-02); with pyarrow 26.0.1, 16 of 100
processes that read a small parquet frame 5 times aborted at their exit (0 of 40 with use_threads=False,
0 of 40 that only wrote). The real package runs its gateway in a thread of the notebook's process."""

import importlib
import json
import os
import sys
import traceback


def main() -> int:
    module, name, data_paths = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    try:
        gateway = getattr(importlib.import_module(module), name)(tuple(data_paths) if data_paths else None)
        gateway.run()
    except Exception:  # noqa: BLE001 -- its last line is the error run_local_gateway reports
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
