"""The gateway's own process: python -m kaggle_evaluation.core.gateway_process MODULE CLASS DATA_PATHS_JSON."""

import importlib
import json
import sys


def main() -> None:
    module, name, data_paths = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    gateway = getattr(importlib.import_module(module), name)(tuple(data_paths) if data_paths else None)
    gateway.run()


if __name__ == "__main__":
    main()
