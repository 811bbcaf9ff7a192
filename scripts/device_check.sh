#!/usr/bin/env bash
# Device check for a lent GPU machine (one H200; the whole script fits in 10 minutes). Run from the repository root:
#
#     bash scripts/device_check.sh            # results in $OUT (the device tool's output folder) or ./device_check_out
#
# 1. creates the virtual environment $VENV (default .venv) with Python 3.11 and installs, as the Makefile does,
#    torch==2.13.0 from the default index (on Linux x86_64 that is the CUDA build), esm==3.2.1.post1 without its
#    dependencies, and this package with its test extra; an existing $VENV whose torch sees CUDA is reused.
#    SYSTEM_PYTHON=1 (or auto, the default, when $VENV does not exist and the machine's python3 has a torch that sees
#    CUDA, as on the GPU machines lent to this project, which reach no package index) installs nothing: it runs the
#    machine's python3 with the package through PYTHONPATH, adding the wheels of a folder .whl/ if there is one (e.g.
#    esm's, which the ESM-C steps need; without it they record the missing module and the protein steps are skipped);
# 2. checks that torch sees CUDA (exit 3 otherwise, with the reason in $OUT/device_check.json);
# 3. runs scripts/device_check.py --profile paper --device cuda: a short, timed slice of every chapter's
#    computation at paper scale (random-init models; see that file), throughput in passes/s and ratios.
#
# Writes to $OUT: device_check.json (the results), setup.log (install and step times), pip_freeze.txt,
# nvidia-smi.txt, device_check.log (the check's output). Overrides: PY, VENV, PROFILE, DEVICE, CHECK_TIMEOUT_S,
# REQUIRE_CUDA=0 (a CPU dry run: PROFILE=smoke DEVICE=cpu REQUIRE_CUDA=0 bash scripts/device_check.sh).
set -euo pipefail

OUT="${OUT:-$PWD/device_check_out}"
PY="${PY:-python3.11}"
VENV="${VENV:-.venv}"
PROFILE="${PROFILE:-paper}"
DEVICE="${DEVICE:-cuda}"
CHECK_TIMEOUT_S="${CHECK_TIMEOUT_S:-420}"
REQUIRE_CUDA="${REQUIRE_CUDA:-1}"
SYSTEM_PYTHON="${SYSTEM_PYTHON:-auto}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$OUT"

log() { echo "[device_check.sh $(date +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$OUT/setup.log"; }

[ -f pyproject.toml ] && [ -f scripts/device_check.py ] || { echo "run from the repository root" >&2; exit 2; }
command -v "$PY" >/dev/null 2>&1 || PY=python3
log "python: $("$PY" --version 2>&1) ($PY)"
(nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 && head -n 15 "$OUT/nvidia-smi.txt") || log "nvidia-smi not available"

has_env() {
  [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$REQUIRE_CUDA" <<'EOF' >/dev/null 2>&1
import sys, torch, esm, mimdm
assert torch.__version__.startswith("2.13.0"), torch.__version__
assert sys.argv[1] == "0" or torch.cuda.is_available()
EOF
}

system_ok() { python3 -c "import torch, numpy, scipy, tqdm; assert torch.cuda.is_available()" >/dev/null 2>&1; }

RUN_PY="$VENV/bin/python"
if has_env; then
  log "reusing $VENV"
elif [ "$SYSTEM_PYTHON" = 1 ] || { [ "$SYSTEM_PYTHON" = auto ] && [ ! -e "$VENV" ] && system_ok; }; then
  RUN_PY=python3
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  log "using the machine's python3 ($(python3 -c 'import torch; print("torch", torch.__version__)')), nothing installed"
  if compgen -G ".whl/*.whl" >/dev/null; then
    rm -rf /tmp/device_check_site
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/device_check_site .whl/*.whl
    export PYTHONPATH="$PYTHONPATH:/tmp/device_check_site"
    log "added the wheels of .whl/: $(ls .whl | tr '\n' ' ')"
  fi
else
  log "creating $VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip
  log "installing torch==2.13.0 (default index)"
  "$VENV/bin/pip" install --quiet torch==2.13.0
  log "installing esm==3.2.1.post1 --no-deps"
  "$VENV/bin/pip" install --quiet --no-deps esm==3.2.1.post1
  log "installing -e .[test]"
  "$VENV/bin/pip" install --quiet -e '.[test]'
  log "install done"
fi
"$RUN_PY" -m pip freeze > "$OUT/pip_freeze.txt" 2>&1 || true

if ! "$RUN_PY" - "$OUT" "$REQUIRE_CUDA" <<'EOF' 2>&1 | tee -a "$OUT/setup.log"; then
import json, sys, torch
out, require = sys.argv[1], sys.argv[2] == "1"
info = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
if info["cuda_available"]:
    info.update(gpu=torch.cuda.get_device_name(0), device_count=torch.cuda.device_count())
print("torch check:", json.dumps(info))
if require and not info["cuda_available"]:
    json.dump({"ok": False, "error": "torch.cuda.is_available() is False", **info}, open(f"{out}/device_check.json", "w"))
    sys.exit(3)
EOF
  log "CUDA is not available: stopping (see $OUT/device_check.json; an existing $VENV with a CPU torch build is not replaced: set VENV to a new path)"
  exit 3
fi

log "running scripts/device_check.py --profile $PROFILE --device $DEVICE (limit ${CHECK_TIMEOUT_S} s)"
rc=0
timeout "$CHECK_TIMEOUT_S" "$RUN_PY" scripts/device_check.py --profile "$PROFILE" --device "$DEVICE" \
  --out "$OUT" --budget-s $((CHECK_TIMEOUT_S * 3 / 4)) 2>&1 | tee "$OUT/device_check.log" || rc=${PIPESTATUS[0]}
log "device_check.py exit status $rc; results in $OUT/device_check.json"
exit "$rc"
