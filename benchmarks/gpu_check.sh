#!/usr/bin/env bash
# GPU check (one CUDA GPU, under 8 minutes): train a Qwen3-0.6B-shaped model from random init with
# the native backend through `trnqwen train`, then through the equivalent raw torchrun command that
# `trnqwen train --export-config` prints, and report tokens/s and MFU of both as
# `trnqwen inspect-logs --json` reads them from each log.
#
#   bash benchmarks/gpu_check.sh                 # defaults: 30 steps, seq 2048, local batch 2
#   STEPS=50 SEQ_LEN=4096 bash benchmarks/gpu_check.sh
#
# Offline: the model config is written here (Qwen3-0.6B's published architecture, random
# weights), the tokenizer comes from `trnqwen fetch builtin:tiny-qwen3` and the data is trnqwen's
# bundled corpus, so nothing is downloaded.  Without a CUDA GPU it stops at once with exit 3.
# Results: a table on stdout, and gpu_check.json in $OUT (if set) or the work folder.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
STEPS="${STEPS:-30}"
SEQ_LEN="${SEQ_LEN:-2048}"
LOCAL_BATCH="${LOCAL_BATCH:-2}"
RUN_TIMEOUT="${RUN_TIMEOUT:-200}"   # seconds per training run (two runs must fit in 8 minutes)
WORK="${WORK:-$(mktemp -d -t trnqwen-gpu-check.XXXXXX)}"
RESULT_DIR="${OUT:-$WORK}"

# torchrun (in the hand-run line) from the same environment; trnqwen importable without installing
export PATH="$(dirname "$PY"):$PATH"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

die() { echo "gpu_check: $1" >&2; exit "${2:-1}"; }
trnqwen() { (cd "$WORK" && "$PY" -m trnqwen "$@"); }

# --- 1. a CUDA GPU, or stop clearly -------------------------------------------------------------
command -v nvidia-smi >/dev/null 2>&1 || die "no CUDA GPU here: nvidia-smi is not on PATH (this check needs one NVIDIA GPU)" 3
GPUS="$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true)"
[ -n "$GPUS" ] || die "no CUDA GPU here: nvidia-smi lists no GPU" 3
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
  || die "torch in $PY cannot use CUDA (CPU-only build, or no driver): $("$PY" -c 'import torch; print(torch.__version__)' 2>&1 | tail -1)" 3
GPU_NAME="$(echo "$GPUS" | head -1 | cut -d, -f1)"
echo "gpu_check: $GPU_NAME; work folder $WORK" >&2

# --- 2. offline assets: Qwen3-0.6B's architecture, random init ---------------------------------
ASSETS="$WORK/assets/Qwen3-0.6B-shaped"
trnqwen fetch builtin:tiny-qwen3 --local-dir "$WORK/assets/tiny-qwen3" --no-progress >/dev/null \
  || die "could not write the built-in tokenizer (trnqwen fetch builtin:tiny-qwen3)"
mkdir -p "$ASSETS"
cp "$WORK/assets/tiny-qwen3/tokenizer.json" "$WORK/assets/tiny-qwen3/tokenizer_config.json" "$ASSETS/"
"$PY" - "$ASSETS/config.json" <<'EOF'
import json, sys
# Qwen/Qwen3-0.6B's published config.json (architecture only; no weights are read: random init).
config = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000, "tie_word_embeddings": True, "hidden_act": "silu",
    "attention_bias": False, "attention_dropout": 0.0, "torch_dtype": "bfloat16",
    "bos_token_id": 151643, "eos_token_id": 151645,
}
json.dump(config, open(sys.argv[1], "w"), indent=2)
EOF
DATA="$ROOT/trnqwen/data/tiny_corpus/corpus.txt"
[ -f "$DATA" ] || die "bundled corpus missing: $DATA"
ARGS=(--model "$ASSETS" --assets "$ASSETS" --backend native --device cuda --nproc-per-node 1
      --no-finetune --no-export-hf --steps "$STEPS" --seq-len "$SEQ_LEN" --local-batch-size "$LOCAL_BATCH"
      --dataset "$DATA")

# --- 3. through trnqwen train ---------------------------------------------------------------------
echo "gpu_check: trnqwen train (${STEPS} steps, seq ${SEQ_LEN}, local batch ${LOCAL_BATCH})" >&2
T0=$(date +%s)
(cd "$WORK" && timeout --signal=TERM "$RUN_TIMEOUT" \
  "$PY" -m trnqwen train "${ARGS[@]}" --json) > "$WORK/trnqwen_train.json" \
  || die "trnqwen train failed (exit $?); see the run dir under $WORK/.trnqwen/runs"
T_TRNQWEN=$(( $(date +%s) - T0 ))
RUN_DIR="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_dir"])' "$WORK/trnqwen_train.json")"

# --- 4. the same run by hand: the raw torchrun line --export-config gives -------------------------
trnqwen train "${ARGS[@]}" --export-config "$WORK/gpu_qwen3_config.py" --json > "$WORK/export.json" \
  || die "trnqwen train --export-config failed"
HAND="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["hand_run_command"])' "$WORK/export.json")"
echo "gpu_check: by hand: $HAND" >&2
mkdir -p "$WORK/by-hand"
T0=$(date +%s)
(cd "$WORK/by-hand" && timeout --signal=TERM "$RUN_TIMEOUT" bash -c "$HAND") > "$WORK/by-hand/train.log" 2>&1 \
  || die "the raw torchrun command failed (exit $?); log: $WORK/by-hand/train.log"
T_HAND=$(( $(date +%s) - T0 ))

# --- 5. both logs through inspect-logs --json ----------------------------------------------------------
trnqwen inspect-logs "$RUN_DIR" --json > "$WORK/inspect_trnqwen.json" || true
trnqwen inspect-logs "$WORK/by-hand/train.log" --json > "$WORK/inspect_by_hand.json" || true
mkdir -p "$RESULT_DIR"
"$PY" - "$WORK" "$RESULT_DIR/gpu_check.json" "$GPU_NAME" "$T_TRNQWEN" "$T_HAND" "$STEPS" "$SEQ_LEN" "$LOCAL_BATCH" <<'EOF'
import json, sys
work, dest, gpu, t_tq, t_hand, steps, seq, lbs = sys.argv[1:9]
def summary(name):
    try:
        return json.load(open(f"{work}/{name}"))["summary"]
    except (OSError, ValueError, KeyError):
        return {}
a, b = summary("inspect_trnqwen.json"), summary("inspect_by_hand.json")
def ratio(x, y):
    return round(x / y, 3) if x and y else None
out = {
    "benchmark": "gpu_check", "gpu": gpu, "model": "Qwen3-0.6B-shaped, random init, native backend",
    "steps": int(steps), "seq_len": int(seq), "local_batch_size": int(lbs),
    "trnqwen_tps": a.get("mean_tps_after_step1"), "trnqwen_mfu_pct": a.get("mean_mfu_after_step1"),
    "trnqwen_steps_logged": a.get("steps_logged"), "trnqwen_wall_s": int(t_tq),
    "by_hand_tps": b.get("mean_tps_after_step1"), "by_hand_mfu_pct": b.get("mean_mfu_after_step1"),
    "by_hand_steps_logged": b.get("steps_logged"), "by_hand_wall_s": int(t_hand),
}
out["tps_trnqwen_vs_by_hand"] = ratio(out["trnqwen_tps"], out["by_hand_tps"])
json.dump(out, open(dest, "w"), indent=2)
print(f"{'':24s} {'trnqwen train':>14s} {'torchrun by hand':>17s}")
for label, k in (("tokens/s (after step 1)", "tps"), ("MFU % (after step 1)", "mfu_pct"), ("steps logged", "steps_logged"), ("wall s", "wall_s")):
    print(f"{label:24s} {str(out['trnqwen_' + k]):>14s} {str(out['by_hand_' + k]):>17s}")
print(json.dumps(out))
if not (a.get("steps_logged") and b.get("steps_logged")):
    sys.exit("gpu_check: a run logged no steps (see the logs under " + work + ")")
EOF
