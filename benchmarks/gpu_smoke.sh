#!/usr/bin/env bash
# The GPU smoke run: everything that only a real CUDA device can show, in one go, the day a GPU
# is at hand (no test on a CPU machine can stand in for it). From the repository root:
#
#     bash benchmarks/gpu_smoke.sh [WORKDIR]          # ~5-10 min on one GPU
#
# It renders a project on the built-in digits data (kagtpl's demo dataset) with --gpu auto and:
#   1. dry-runs train.py with each AMP mode (bf16 where native, fp16 + GradScaler, fp32);
#   2. trains under torch.cuda.set_per_process_memory_fraction with a batch that cannot fit, so
#      a real OOM is raised and recovered (OOM: lines, training goes on);
#   3. runs predict.py on a smaller memory fraction than training had (its batch comes from the
#      card it runs on; an OOM halves it);
#   4. runs run.py --budget 10m (the probe's PROBE: lines, the planner, a submission);
#   5. runs kagtpl doctor on that log;
#   6. with 2+ GPUs (or on CPU), dry-runs --parallel folds and --parallel ddp through torchrun;
#   7. runs tune.py with 2 workers sharing the card (each capped at its share; probe per trial).
# Every step's output is kept in WORKDIR/logs; the last line says which steps failed.
# SMOKE_DEVICE=cpu runs the same steps on CPU, skipping the CUDA-only ones (to check the script);
# SMOKE_BUDGET sets step 4's budget (default 10m), SMOKE_TUNE_BUDGET step 7's (default 5m).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
WORK="${1:-$(mktemp -d /tmp/kagtpl-gpu-smoke.XXXX)}"
DEVICE="${SMOKE_DEVICE:-cuda}"
BUDGET="${SMOKE_BUDGET:-10m}"
mkdir -p "$WORK/logs"
FAILED=()

step() {  # step NAME CMD...: run in the project, log to logs/NAME.log, remember failures
    local name="$1"; shift
    echo "== $name: $*"
    if (cd "$WORK/digits" && "$@") >"$WORK/logs/$name.log" 2>&1; then
        echo "   ok ($(tail -n 1 "$WORK/logs/$name.log"))"
    else
        echo "   FAILED: see $WORK/logs/$name.log"; tail -n 5 "$WORK/logs/$name.log" | sed 's/^/   | /'
        FAILED+=("$name")
    fi
}

"$PY" - "$WORK" "$DEVICE" <<'EOF' || { echo "could not render the project"; exit 1; }
import sys
from pathlib import Path

from kagtpl import demo, new

work, device = Path(sys.argv[1]), sys.argv[2]
data = demo.write_digits(work / "data", n_train=1200, n_test=297)
gpu = "auto" if device == "cuda" else "cpu"
new.new_project(new.NewAnswers(name="digits", task="image", gpu=gpu, data=data, model="resnet18",
                               image_size=64, folds=3, epochs=8, dest=work, force=True))
print(f"rendered {work / 'digits'} (--gpu {gpu})")
EOF
git -C "$WORK/digits" init -q && git -C "$WORK/digits" add -A \
    && git -C "$WORK/digits" -c user.name=smoke -c user.email=smoke@kagtpl.invalid commit -qm smoke

NVIDIA_SMI="$(command -v nvidia-smi || true)"
[ -n "$NVIDIA_SMI" ] && "$NVIDIA_SMI" --query-gpu=name,memory.total,compute_cap --format=csv | tee "$WORK/logs/gpu.txt"

# 1. each AMP mode (bf16 only where the card has it natively: compute capability >= 8)
if [ "$DEVICE" = cuda ]; then
    CAP="$("$PY" -c 'import torch; print(torch.cuda.get_device_capability()[0])')"
    MODES="fp16 fp32"; [ "$CAP" -ge 8 ] && MODES="bf16 $MODES"
else
    MODES="off"
fi
for mode in $MODES; do
    step "dry-run-$mode" "$PY" train.py --dry-run --device "$DEVICE" --amp "$mode" --no-pretrained --out-dir "out-$mode"
done

if [ "$DEVICE" = cuda ]; then
    # 2. a real OOM: 4 GB of the card at most, a batch of 4096 images of 224 px (needs far more)
    step real-oom "$PY" -c '
import runpy, sys, torch
torch.cuda.set_per_process_memory_fraction(4 * 1024**3 / torch.cuda.get_device_properties(0).total_memory)
sys.argv = ["train.py", "--device", "cuda", "--no-pretrained", "--no-autoscale", "--image-size", "224",
            "--batch-size", "1024", "--epochs", "1", "--folds", "2", "--out-dir", "out-oom"]
runpy.run_path("train.py", run_name="__main__")'
    grep -q "^OOM: batch of" "$WORK/logs/real-oom.log" || { echo "   no OOM: line in real-oom.log"; FAILED+=("real-oom-line"); }
    # 3. predict on less memory than training had: 1 GB
    step predict-small "$PY" -c '
import runpy, sys, torch
torch.cuda.set_per_process_memory_fraction(1024**3 / torch.cuda.get_device_properties(0).total_memory)
sys.argv = ["predict.py", "--device", "cuda", "--out-dir", "out-oom"]
runpy.run_path("predict.py", run_name="__main__")'
fi

# 4. the whole run under a budget, probe included; 5. doctor on its log (GPU logs only)
step run-budget "$PY" run.py --budget "$BUDGET" --device "$DEVICE" --no-pretrained
grep -q "^SUBMISSION: " "$WORK/logs/run-budget.log" || FAILED+=("no-submission")
if [ "$DEVICE" = cuda ]; then
    step doctor "$PY" -m kagtpl doctor "$WORK/logs/run-budget.log"
    grep -q "^PROBE: batch=" "$WORK/logs/run-budget.log" || FAILED+=("probe-lines")
fi
step experiments "$PY" experiments.py

# 6. more than one GPU (docs/parallel.md): fold workers, and DDP through torchrun (NCCL; gloo on CPU)
NGPU=0; [ "$DEVICE" = cuda ] && NGPU="$("$PY" -c 'import torch; print(torch.cuda.device_count())')"
if [ "$DEVICE" = cpu ] || [ "$NGPU" -ge 2 ]; then
    DEVICES=(); [ "$DEVICE" = cpu ] && DEVICES=(--devices cpu,cpu)
    step folds "$PY" train.py --dry-run --device "$DEVICE" --parallel folds "${DEVICES[@]}" --no-pretrained --out-dir out-folds
    step ddp "$PY" -m torch.distributed.run --standalone --nproc-per-node=2 train.py --dry-run --device "$DEVICE" \
        --parallel ddp --no-pretrained --out-dir out-ddp
else
    echo "== folds, ddp: skipped ($NGPU GPU visible; they need 2)"
fi

# 7. two tune.py workers on one card: each allocator capped at half, the probe sizing each trial in it
step tune "$PY" tune.py --trials 4 --workers 2 --budget "${SMOKE_TUNE_BUDGET:-5m}" --device "$DEVICE" --no-pretrained --epochs 3 --out-dir out-tune
grep -q "^TUNE BEST: " "$WORK/logs/tune.log" || FAILED+=("tune-best")
grep -q "^\[tune1\] TUNE: trial=" "$WORK/logs/tune.log" || FAILED+=("tune-workers")

echo "logs: $WORK/logs"
if [ ${#FAILED[@]} -gt 0 ]; then
    echo "GPU SMOKE: FAILED: ${FAILED[*]}"
    exit 1
fi
echo "GPU SMOKE: all steps passed on $DEVICE"
