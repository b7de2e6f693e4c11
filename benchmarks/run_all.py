"""Run every benchmark, one after the other (about 70 minutes on a 2-core machine):

python benchmarks/run_all.py
"""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = [
    "training_loop.py",
    "tabular_batching.py",
    "image_pipeline.py",
    "time_budget.py",
    "generator_latency.py",
    "batch_probe.py",
    "probe_log.py",
    "small_data_recipe.py",
    "input_headroom.py",
    "fold_parallel.py",
    "text_padding.py",
    "text_score.py",
    "segmentation.py",
    "detection.py",
    "audio.py",
    "audio_tta.py",
    "onnx_export.py",
    "tabular_models.py",
    "tune_storage.py",
    "tune_pruners.py",
    "budget_growth.py",
]

if __name__ == "__main__":
    failed = []
    for script in SCRIPTS:
        print(f"\n$ python benchmarks/{script}", flush=True)
        if subprocess.run([sys.executable, script], cwd=HERE).returncode:
            failed.append(script)
    sys.exit(f"failed: {', '.join(failed)}" if failed else 0)
