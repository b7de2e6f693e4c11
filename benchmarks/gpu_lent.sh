#!/usr/bin/env bash
# The whole GPU check in one command, for a lent card with minutes to spare (docs/gpu-check.md,
# "A lent card"). From the repository root, on the GPU machine:
#
#     OUT=/some/folder bash benchmarks/gpu_lent.sh       # ~10 min on one H100
#
# 1. installs WHEELS/*.whl (default .whl: what the machine lacks, made where pip works) into /tmp/site;
# 2. gpu_throughput.py alone (nothing else on the card while it times): TP_IMAGES, TP_EPOCHS and
#    TP_VARIANTS (train.py's --compile on / --cudnn-benchmark rows: "compile,cudnn", or none);
# 3. budget_growth.py alone on the card (issue 48): the image project under run.py --budget GROWTH_BUDGET
#    with growth and with --no-grow, on GROWTH_IMAGES digits: the budget used and the held-out log loss;
# 4. then, side by side, gpu_smoke.sh's steps 1-8 with the image task, and two chains of the other
#    tasks through gpu_tasks.py (TASK_BUDGET each): the tasks are checked for what they hand in,
#    not timed, so sharing the card and the 16 cores is fair (their epoch times are not figures).
# AUDIO_DATA: the audio task's data made beforehand (`gpu_tasks.py W --write-audio-only`, where
# espeak-ng is); gpu_tasks.py writes it itself when espeak-ng is there. Each phase has a timeout
# (TP_S, GROWTH_S, PHASE_S seconds) so the command ends inside a lent call; every output lands in OUT.
set -u
cd "$(dirname "$0")/.."
ROOT="$PWD"
OUT="${OUT:?set OUT: the folder the outputs go to}"
T0=$(date +%s)
el() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
if compgen -G "${WHEELS:-.whl}/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "${WHEELS:-.whl}"/*.whl >"$OUT/install.txt" 2>&1 || { el "install failed"; tail "$OUT/install.txt"; exit 1; }
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH="$ROOT/generator:${PYTHONPATH:-}" PYTHON=python3 NO_ALBUMENTATIONS_UPDATE=1 HF_HUB_OFFLINE=1 \
    PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv | tee "$OUT/card.txt"
python3 -c 'import torch, timm, transformers, peft; print("torch", torch.__version__, "transformers",
transformers.__version__, "timm", timm.__version__, "peft", peft.__version__)' 2>&1 | tee -a "$OUT/card.txt"

export W="${WORK:-/tmp/kagtpl-gpu-lent}"
mkdir -p "$W"
[ -n "${AUDIO_DATA:-}" ] && mkdir -p "$W/w-audio" && cp -r "$AUDIO_DATA" "$W/w-audio/audio-data"
el "throughput (alone on the card)"
timeout "${TP_S:-240}" python3 benchmarks/gpu_throughput.py --images "${TP_IMAGES:-8000}" --epochs "${TP_EPOCHS:-5}" \
    --variants "${TP_VARIANTS:-compile,cudnn}" --work "$W/tp" >"$OUT/throughput.txt" 2>&1
el "throughput rc=$?"
el "budget growth (alone on the card)"
timeout "${GROWTH_S:-240}" python3 benchmarks/budget_growth.py --device cuda --tasks image \
    --image-budget "${GROWTH_BUDGET:-90s}" --images "${GROWTH_IMAGES:-1200}" >"$OUT/growth.txt" 2>&1
el "budget growth rc=$?"

chain() {  # chain NAME TASK...: gpu_tasks.py on each task, one after the other
    local name="$1"
    shift
    for t in "$@"; do python3 benchmarks/gpu_tasks.py "$W/w-$t" --tasks "$t" --budget "${TASK_BUDGET:-75s}"; done \
        >"$OUT/tasks-$name.txt" 2>&1
}
export -f chain
el "smoke and tasks, side by side"
timeout "${PHASE_S:-300}" bash -c "chain a tabular text llm" &
timeout "${PHASE_S:-300}" bash -c "chain b segmentation detection audio" &
SMOKE_BUDGET=1m SMOKE_TUNE_BUDGET=45s SMOKE_TUNE_TRIALS=2 SMOKE_TUNE_EPOCHS=2 SMOKE_TASKS=image \
    SMOKE_TASK_BUDGET="${TASK_BUDGET:-75s}" timeout "${PHASE_S:-300}" bash benchmarks/gpu_smoke.sh "$W/smoke" \
    >"$OUT/smoke.txt" 2>&1
el "smoke rc=$?"
wait
el "all done"
grep -v "Warning\|warn(" "$OUT/throughput.txt"
grep -A20 "^project " "$OUT/growth.txt"
grep -h "^[a-z]* *\(ok\|FAILED\) " "$OUT"/tasks-*.txt
tail -n 1 "$OUT/smoke.txt"
# the logs alone (a tar of the work folder less its data was over the 16 MB a returned file may have)
(cd "$W" && find . -name '*.log' -size -2M | tar czf "$OUT/logs.tgz" -T -) 2>/dev/null
