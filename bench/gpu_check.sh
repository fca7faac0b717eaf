#!/usr/bin/env bash
# One device check (run through the device tool, from the repo root, with .whl and .gpu carried), through the
# benchmark entry point: part 2 (generation) and part 3 (training round, ours against TRL) on the GPU, three
# generation processes sharing it, and a coordinator + 3 workers on one GPU. Results land in $OUT as
# generation_<gpu>.json/.md, training_<gpu>.json/.md, generation_shared-<i>.json and gpu_demo*.txt|log.
# Wheels for what the GPU image lacks travel in .whl (the training part needs trl, accelerate and datasets:
# `pip download --no-deps trl==1.16.0 -d .whl` and the same for any the image lacks); .gpu holds SmolLM2's config
# and tokenizer (the weights are too big to carry: the model is built from its config with random weights, which
# gives the architecture's speed and memory, not its rewards).
set -u
OUT=${OUT:-/tmp/out}
MODEL="--model .gpu/smollm2 --random-init --device cuda:0"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
# pycosat (a C extension reasoning-gym imports; none of our tasks uses it) has no cp312 wheel:
# build it here, and if that fails give the import an inert module (device check only).
python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/site .gpu/pycosat-0.6.6.tar.gz 2>/dev/null \
  || echo 'def solve(*a, **k): raise RuntimeError("pycosat unavailable on this device check")' > /tmp/site/pycosat.py
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -c "import torch, transformers, reasoning_gym; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))" || exit 1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
echo "== part 2: generation, batched against one generate call per completion"
# shellcheck disable=SC2086
timeout 150 python3 -m bench generation $MODEL --prompts 8 --generations 8 --new-tokens 128 --single-calls 4 \
  --out-dir "$OUT" 2>&1 | tail -3
echo "== part 3: GRPO update, this project against TRL's GRPOTrainer"
if python3 -c "import trl" 2>/dev/null; then
  # shellcheck disable=SC2086
  timeout 240 python3 -m bench training $MODEL --prompts 8 --generations 8 --new-tokens 128 --micro-batch 16 \
    --steps 3 --out-dir "$OUT" 2>&1 | tail -3
  cat "$OUT"/training_*.md 2>/dev/null | tail -6
else
  echo "trl is not importable here: put its wheel (and any missing dependency's) in .whl to run part 3"
fi
echo "== 3 generation processes sharing cuda:0"
for i in 1 2 3; do
  # shellcheck disable=SC2086
  timeout 150 python3 -m bench generation $MODEL --prompts 8 --generations 8 --new-tokens 128 --single-calls 2 \
    --tag "shared-$i" --out-dir "$OUT" > "/tmp/shared_$i.log" 2>&1 &
done
wait
grep -h '"tokens_per_s"\|"peak_memory_mb"' "$OUT"/generation_shared-*.json
[ "${SKIP_DEMO:-0}" = 1 ] && exit 0
echo "== swarm: coordinator + 3 workers on one GPU (tiny model)"
timeout 200 python3 -m swarm_gdrive demo --tiny --workers 3 --rounds 3 --device cuda:0 --folder /tmp/gpu-demo \
  > "$OUT/gpu_demo.log" 2>&1; echo "demo exit $?"
tail -8 "$OUT/gpu_demo.log"
python3 - <<'PY' | tee "$OUT/gpu_demo_metrics.txt"
import json, pathlib
for f in sorted(pathlib.Path("/tmp/gpu-demo/experiments/demo/logs").glob("worker-*/metrics.jsonl")):
    rows = [json.loads(l)["values"] for l in f.read_text().splitlines()]
    steps = [r for r in rows if "train/step_s" in r]
    print(f.parent.name, "rounds", len(steps), "peak_gpu_mb", max((r.get("train/peak_memory_mb", 0) for r in steps), default=0),
          "step_s", [round(r["train/step_s"], 3) for r in steps], "device rows", [r.get("gen/tokens_per_s") for r in steps][:3])
PY
