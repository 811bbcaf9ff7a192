#!/usr/bin/env bash
# Continue a long Sudoku MDM run (scripts/train_sudoku_long.py) on a lent GPU machine, time-bounded, and hand
# back what resuming and adopting need. Run from the repository root:
#
#     RUN=deep24 HOURS=0.11 bash scripts/device_long_run.sh
#
# The run's folder (checkpoints/<folder>/, with its committed state.pt) travels with the working tree; the run
# resumes there with the data, masks and schedule it would have had on the CPU (every random draw of training is
# made on the CPU: mimdm.models.training.train_mdm; the arithmetic may differ in rounding), trains in fp32 on CUDA
# for at most HOURS, and writes to $OUT: state.pt in parts under 16 MiB
# (state.pt.part-aa, -ab, ...; `cat state.pt.part-* > state.pt` joins them) with its state.pt.sha256, model.pt and
# model.pt.sha256 once the run has finished, curve.jsonl, config.json and train.log (8 files for a state under 30 MiB). Uses the machine's own python3 with torch (nothing is installed:
# the device machine reaches no index); the package runs from the checkout through PYTHONPATH.
set -euo pipefail
OUT="${OUT:-$PWD/device_long_run_out}"
RUN="${RUN:-deep24}"
HOURS="${HOURS:-0.11}"
PY="${PY:-python3}"
DEVICE="${DEVICE:-cuda}"
mkdir -p "$OUT"
[ -f scripts/train_sudoku_long.py ] || { echo "run from the repository root" >&2; exit 2; }
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
folder=$("$PY" - "$RUN" <<'PY'
import sys
from mimdm.pipelines.long_run import RUNS
print(RUNS[sys.argv[1]][1])
PY
)
dir="checkpoints/$folder"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
rc=0
"$PY" scripts/train_sudoku_long.py --run "$RUN" --device "$DEVICE" --hours "$HOURS" --eval-every 1000 --no-progress \
  2>&1 | tee "$OUT/train.log" || rc=${PIPESTATUS[0]}
set +e  # hand back whatever exists, then exit with the training's status
split -b 15M "$dir/state.pt" "$OUT/state.pt.part-"
cp "$dir/state.pt.sha256" "$dir/curve.jsonl" "$dir/config.json" "$OUT/"
cat "$OUT/state.pt.sha256"
if [ -f "$dir/model.pt" ]; then cp "$dir/model.pt" "$dir/model.pt.sha256" "$OUT/"; else echo "no model.pt yet: the run has not finished"; fi
exit "$rc"
