#!/usr/bin/env bash
# Hugging Face checkpoint -> TensorRT-LLM checkpoint -> TensorRT-LLM engine -> Triton model repository.
# A vision-language model (--multimodal) also gets its visual engine, built beside the LLM engine by
# TensorRT-LLM's build_multimodal_engine.py, and upstream's C++ multimodal repository.
#
# Runs inside the NGC `tritonserver:<yy.mm>-trtllm-python-py3` container (or any host with the same
# tensorrt_llm wheel, trtllm-build and a GPU). Every step is cached under --cache-dir, keyed on its
# inputs, so a re-run with the same inputs does nothing and a change of engine limits reuses the
# converted checkpoint. --dry-run prints every command instead of running it.
set -euo pipefail

PROG=build_engine
# Pure bash (no dirname): the scripts also run with a minimal PATH.
HERE=${BASH_SOURCE[0]%/*}
[[ $HERE == "${BASH_SOURCE[0]}" ]] && HERE=.
# shellcheck source=deploy/common.sh
source "$HERE/common.sh"
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(dirname "$SCRIPT_DIR")

usage() {
  cat <<EOF
Usage: deploy/build_engine.sh --hf-model DIR [options]

Model
  --hf-model DIR            Hugging Face model directory (config.json, weights, tokenizer)  [HF_MODEL_DIR]
  --hf-model-id ID          download this Hugging Face Hub model into --hf-model first when
                            that directory has no config.json (HF_TOKEN for gated models)  [HF_MODEL_ID]
  --hf-revision REV         Hub revision (branch, tag or commit) for --hf-model-id         [HF_REVISION]
  --name NAME               name used in cache paths (default: basename of --hf-model)     [MODEL_NAME]
  --family FAMILY           convert_checkpoint.py family: llama, qwen, gpt, phi
                            (default: from config.json model_type)                          [MODEL_FAMILY]
  --convert-script FILE     use this convert_checkpoint.py instead of the family's          [CONVERT_SCRIPT]
  --dtype DTYPE             auto, float16 or bfloat16 (auto: config.json torch_dtype,
                            float32 becomes float16, as convert_checkpoint.py does)         [DTYPE]
Parallelism
  --tp N                    tensor-parallel size (default 1)                                [TP_SIZE]
  --pp N                    pipeline-parallel size (default 1)                              [PP_SIZE]
  --workers N               parallel trtllm-build workers (default: tp*pp)                  [BUILD_WORKERS]
Engine limits
  --max-batch-size N        default 64                                                      [MAX_BATCH_SIZE]
  --max-input-len N         default 4096, at most the model's context                       [MAX_INPUT_LEN]
  --max-seq-len N           default 8192, at most the model's context                       [MAX_SEQ_LEN]
  --max-num-tokens N        default 8192                                                    [MAX_NUM_TOKENS]
  --kv-cache-flag FORM      how to ask trtllm-build for a paged KV cache: auto (ask
                            trtllm-build --help), kv_cache_type (--kv_cache_type paged) or
                            paged_kv_cache (--paged_kv_cache enable, older releases)        [KV_CACHE_FLAG]
  --convert-arg ARG         extra convert_checkpoint.py argument (repeatable)
  --build-arg ARG           extra trtllm-build argument (repeatable)
Tools
  --examples-dir DIR        TensorRT-LLM examples/ matching the installed tensorrt_llm     [TRTLLM_EXAMPLES_DIR]
  --fetch-examples          without --examples-dir, clone TensorRT-LLM at tag v<tensorrt_llm
                            version> into <cache-dir>/src/TensorRT-LLM-v<version> unless a
                            checkout is already there (copy one there on offline hosts);
                            TRTLLM_GIT_URL names a mirror (default: NVIDIA's GitHub repo)   [TRTLLM_FETCH_EXAMPLES=1]
  --trtllm-version V        expected tensorrt_llm version (checked against the installed one) [TRTLLM_VERSION]
  --cache-dir DIR           engine cache (default ./engines)                                [ENGINE_CACHE_DIR]
Vision-language models (the C++ multimodal path: TensorRT-LLM releases up to 1.2)
  --multimodal TYPE         also build the visual engine: build_multimodal_engine.py's
                            --model_type (llava, llava_next, vila, qwen2_vl, blip2, ...);
                            auto: from config.json's model_type. The LLM engine gets
                            --max_multimodal_len and the repository is upstream's multimodal
                            one (all_models/multimodal over inflight_batcher_llm)        [MULTIMODAL_TYPE]
  --max-images N            images per request (default 1)                                  [MAX_IMAGES]
  --image-features N        visual features (prompt-table rows) one image takes; default
                            for llava/vila/blip2, required for other types               [IMAGE_FEATURES]
  --triton-models-dir DIR   TensorRT-LLM's triton_backend/all_models (default: beside the
                            examples: <examples>/../triton_backend/all_models)            [TRTLLM_TRITON_MODELS_DIR]
  --visual-engine-dir-at-serve DIR  visual engine path as Triton will see it (default: where
                            it is built)                                                  [VISUAL_ENGINE_DIR_AT_SERVE]
Model repository (rendered from model_repo_templates/ when --repo-out is given)
  --repo-out DIR            render the Triton model repository for the engine into DIR     [MODEL_REPO_DIR]
  --variant V               current or legacy (default current)                            [REPO_VARIANT]
  --tokenizer-dir DIR       tokenizer for pre/postprocessing (default: --hf-model)         [TOKENIZER_DIR]
  --engine-dir-at-serve DIR engine path as Triton will see it (default: where it is built) [ENGINE_DIR_AT_SERVE]
  --tokenizer-dir-at-serve DIR  tokenizer path as Triton will see it (default: --tokenizer-dir) [TOKENIZER_DIR_AT_SERVE]
  --kv-cache-free-gpu-mem-fraction F  default 0.9                                          [KV_CACHE_FREE_GPU_MEM_FRACTION]
  --batch-scheduler-policy P          max_utilization or guaranteed_no_evict (default)     [BATCH_SCHEDULER_POLICY]
  --set KEY=VALUE           extra renderer variable (repeatable; with --multimodal MODEL.KEY=VALUE,
                            e.g. tensorrt_llm.enable_chunked_context=true)
                            (the renderer runs as DEPLOY_PYTHON -m deploy.model_repo with
                            PYTHONPATH=DEPLOY_PYTHONPATH; defaults: python3, this repository)
Other
  --force                   rebuild even when the cache holds this engine
  --dry-run                 print every command, run none; tool and GPU checks are skipped
  -h, --help                this text
EOF
}


# --- options: environment first, flags override -------------------------------------------------
HF_MODEL_DIR=${HF_MODEL_DIR:-}
HF_MODEL_ID=${HF_MODEL_ID:-}
HF_REVISION=${HF_REVISION:-}
MODEL_NAME=${MODEL_NAME:-}
MODEL_FAMILY=${MODEL_FAMILY:-}
CONVERT_SCRIPT=${CONVERT_SCRIPT:-}
DTYPE=${DTYPE:-auto}
TP_SIZE=${TP_SIZE:-1}
PP_SIZE=${PP_SIZE:-1}
BUILD_WORKERS=${BUILD_WORKERS:-}
MAX_BATCH_SIZE=${MAX_BATCH_SIZE:-64}
MAX_INPUT_LEN=${MAX_INPUT_LEN:-}
MAX_SEQ_LEN=${MAX_SEQ_LEN:-}
MAX_NUM_TOKENS=${MAX_NUM_TOKENS:-8192}
KV_CACHE_FLAG=${KV_CACHE_FLAG:-auto}
TRTLLM_EXAMPLES_DIR=${TRTLLM_EXAMPLES_DIR:-}
TRTLLM_FETCH_EXAMPLES=${TRTLLM_FETCH_EXAMPLES:-0}
TRTLLM_VERSION=${TRTLLM_VERSION:-}
TRTLLM_GIT_URL=${TRTLLM_GIT_URL:-https://github.com/NVIDIA/TensorRT-LLM.git}
ENGINE_CACHE_DIR=${ENGINE_CACHE_DIR:-./engines}
MODEL_REPO_DIR=${MODEL_REPO_DIR:-}
REPO_VARIANT=${REPO_VARIANT:-current}
TOKENIZER_DIR=${TOKENIZER_DIR:-}
ENGINE_DIR_AT_SERVE=${ENGINE_DIR_AT_SERVE:-}
TOKENIZER_DIR_AT_SERVE=${TOKENIZER_DIR_AT_SERVE:-}
KV_CACHE_FREE_GPU_MEM_FRACTION=${KV_CACHE_FREE_GPU_MEM_FRACTION:-0.9}
BATCH_SCHEDULER_POLICY=${BATCH_SCHEDULER_POLICY:-guaranteed_no_evict}
MULTIMODAL_TYPE=${MULTIMODAL_TYPE:-}
MAX_IMAGES=${MAX_IMAGES:-1}
IMAGE_FEATURES=${IMAGE_FEATURES:-}
TRTLLM_TRITON_MODELS_DIR=${TRTLLM_TRITON_MODELS_DIR:-}
VISUAL_ENGINE_DIR_AT_SERVE=${VISUAL_ENGINE_DIR_AT_SERVE:-}
# Where `python3 -m deploy.model_repo` finds the deploy package and its dependencies.
DEPLOY_PYTHONPATH=${DEPLOY_PYTHONPATH:-$REPO_ROOT}
DEPLOY_PYTHON=${DEPLOY_PYTHON:-python3}
FORCE=0
DRY_RUN=0
CONVERT_ARGS=()
BUILD_ARGS=()
RENDER_SETS=()

while [[ $# -gt 0 ]]; do
  case $1 in
    --hf-model) need_value "$@"; HF_MODEL_DIR=$2; shift 2 ;;
    --hf-model-id) need_value "$@"; HF_MODEL_ID=$2; shift 2 ;;
    --hf-revision) need_value "$@"; HF_REVISION=$2; shift 2 ;;
    --name) need_value "$@"; MODEL_NAME=$2; shift 2 ;;
    --family) need_value "$@"; MODEL_FAMILY=$2; shift 2 ;;
    --convert-script) need_value "$@"; CONVERT_SCRIPT=$2; shift 2 ;;
    --dtype) need_value "$@"; DTYPE=$2; shift 2 ;;
    --tp) need_value "$@"; TP_SIZE=$2; shift 2 ;;
    --pp) need_value "$@"; PP_SIZE=$2; shift 2 ;;
    --workers) need_value "$@"; BUILD_WORKERS=$2; shift 2 ;;
    --max-batch-size) need_value "$@"; MAX_BATCH_SIZE=$2; shift 2 ;;
    --max-input-len) need_value "$@"; MAX_INPUT_LEN=$2; shift 2 ;;
    --max-seq-len) need_value "$@"; MAX_SEQ_LEN=$2; shift 2 ;;
    --max-num-tokens) need_value "$@"; MAX_NUM_TOKENS=$2; shift 2 ;;
    --kv-cache-flag) need_value "$@"; KV_CACHE_FLAG=$2; shift 2 ;;
    --convert-arg) need_value "$@"; CONVERT_ARGS+=("$2"); shift 2 ;;
    --build-arg) need_value "$@"; BUILD_ARGS+=("$2"); shift 2 ;;
    --examples-dir) need_value "$@"; TRTLLM_EXAMPLES_DIR=$2; shift 2 ;;
    --fetch-examples) TRTLLM_FETCH_EXAMPLES=1; shift ;;
    --trtllm-version) need_value "$@"; TRTLLM_VERSION=$2; shift 2 ;;
    --cache-dir) need_value "$@"; ENGINE_CACHE_DIR=$2; shift 2 ;;
    --repo-out) need_value "$@"; MODEL_REPO_DIR=$2; shift 2 ;;
    --variant) need_value "$@"; REPO_VARIANT=$2; shift 2 ;;
    --tokenizer-dir) need_value "$@"; TOKENIZER_DIR=$2; shift 2 ;;
    --engine-dir-at-serve) need_value "$@"; ENGINE_DIR_AT_SERVE=$2; shift 2 ;;
    --tokenizer-dir-at-serve) need_value "$@"; TOKENIZER_DIR_AT_SERVE=$2; shift 2 ;;
    --kv-cache-free-gpu-mem-fraction) need_value "$@"; KV_CACHE_FREE_GPU_MEM_FRACTION=$2; shift 2 ;;
    --batch-scheduler-policy) need_value "$@"; BATCH_SCHEDULER_POLICY=$2; shift 2 ;;
    --set) need_value "$@"; RENDER_SETS+=("$2"); shift 2 ;;
    --multimodal) need_value "$@"; MULTIMODAL_TYPE=$2; shift 2 ;;
    --max-images) need_value "$@"; MAX_IMAGES=$2; shift 2 ;;
    --image-features) need_value "$@"; IMAGE_FEATURES=$2; shift 2 ;;
    --triton-models-dir) need_value "$@"; TRTLLM_TRITON_MODELS_DIR=$2; shift 2 ;;
    --visual-engine-dir-at-serve) need_value "$@"; VISUAL_ENGINE_DIR_AT_SERVE=$2; shift 2 ;;
    --force) FORCE=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown option: $1" ;;
  esac
done

# --- helpers -----------------------------------------------------------------------------------------
# Print a command the way a shell would re-read it, then run it unless this is a dry run.
run() {
  echo "+ $(shell_quote "$@")"
  if [[ $DRY_RUN == 0 ]]; then
    "$@"
  fi
}

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }

sha256_of_text() { sha256sum | cut -c1-64; }

require_tool() {
  command -v "$1" >/dev/null 2>&1 || die "$1 not found on PATH: $2"
}

# --- validate the plain options ----------------------------------------------------------------------
[[ -n $HF_MODEL_DIR ]] || { usage >&2; die "--hf-model is required"; }
require_uint --tp "$TP_SIZE"
require_uint --pp "$PP_SIZE"
require_uint --max-batch-size "$MAX_BATCH_SIZE"
require_uint --max-num-tokens "$MAX_NUM_TOKENS"
require_uint --max-images "$MAX_IMAGES"
[[ -z $IMAGE_FEATURES ]] || require_uint --image-features "$IMAGE_FEATURES"
[[ -z $MULTIMODAL_TYPE || $MULTIMODAL_TYPE =~ ^[a-z0-9_-]+$ ]] || die "--multimodal must be a build_multimodal_engine.py model type (llava, qwen2_vl, ...), got '$MULTIMODAL_TYPE'"
[[ -z $MAX_INPUT_LEN ]] || require_uint --max-input-len "$MAX_INPUT_LEN"
[[ -z $MAX_SEQ_LEN ]] || require_uint --max-seq-len "$MAX_SEQ_LEN"
WORLD_SIZE=$((TP_SIZE * PP_SIZE))
BUILD_WORKERS=${BUILD_WORKERS:-$WORLD_SIZE}
require_uint --workers "$BUILD_WORKERS"
case $DTYPE in auto | float16 | bfloat16) ;; *) die "--dtype must be auto, float16 or bfloat16, got '$DTYPE'" ;; esac
case $KV_CACHE_FLAG in auto | kv_cache_type | paged_kv_cache) ;; *) die "--kv-cache-flag must be auto, kv_cache_type or paged_kv_cache" ;; esac
case $REPO_VARIANT in current | legacy) ;; *) die "--variant must be current or legacy, got '$REPO_VARIANT'" ;; esac
case $BATCH_SCHEDULER_POLICY in max_utilization | guaranteed_no_evict) ;; *) die "--batch-scheduler-policy must be max_utilization or guaranteed_no_evict" ;; esac
# Paths end up in config.pbtxt and in the cache keys: make them absolute once.
abspath() {
  case $1 in
    /*) echo "${1%/}" ;;
    *) echo "$PWD/${1#./}" | sed 's:/*$::' ;;
  esac
}
HF_MODEL_DIR=$(abspath "$HF_MODEL_DIR")
ENGINE_CACHE_DIR=$(abspath "$ENGINE_CACHE_DIR")
[[ -z $MODEL_REPO_DIR ]] || MODEL_REPO_DIR=$(abspath "$MODEL_REPO_DIR")
[[ -z $TOKENIZER_DIR ]] || TOKENIZER_DIR=$(abspath "$TOKENIZER_DIR")
[[ -z $TRTLLM_EXAMPLES_DIR ]] || TRTLLM_EXAMPLES_DIR=$(abspath "$TRTLLM_EXAMPLES_DIR")
[[ -z $CONVERT_SCRIPT ]] || CONVERT_SCRIPT=$(abspath "$CONVERT_SCRIPT")
[[ -z $TRTLLM_TRITON_MODELS_DIR ]] || TRTLLM_TRITON_MODELS_DIR=$(abspath "$TRTLLM_TRITON_MODELS_DIR")
MODEL_NAME=${MODEL_NAME:-$(basename "$HF_MODEL_DIR")}
[[ $MODEL_NAME =~ ^[A-Za-z0-9._-]+$ ]] || die "--name '$MODEL_NAME' may only use letters, digits, '.', '_' and '-'"
TOKENIZER_DIR=${TOKENIZER_DIR:-$HF_MODEL_DIR}

if [[ $DRY_RUN == 1 ]]; then
  note "dry run: printing commands only; not checking for python3, trtllm-build, git, nvidia-smi or GPUs"
fi

# --- download the checkpoint when asked and not there yet -------------------------------------------------
if [[ -n $HF_MODEL_ID && ! -f $HF_MODEL_DIR/config.json ]]; then
  [[ $DRY_RUN == 1 ]] || require_tool python3 "it downloads $HF_MODEL_ID with huggingface_hub"
  note "downloading $HF_MODEL_ID${HF_REVISION:+ at $HF_REVISION} into $HF_MODEL_DIR"
  # Into a sibling first: an interrupted download must not look like a complete checkpoint.
  run rm -rf "$HF_MODEL_DIR.partial"
  run python3 -c 'import sys; from huggingface_hub import snapshot_download; snapshot_download(repo_id=sys.argv[1], revision=sys.argv[2] or None, local_dir=sys.argv[3])' \
    "$HF_MODEL_ID" "$HF_REVISION" "$HF_MODEL_DIR.partial"
  run rm -rf "$HF_MODEL_DIR"
  run mv "$HF_MODEL_DIR.partial" "$HF_MODEL_DIR"
fi

# --- read the Hugging Face config ----------------------------------------------------------------------
HF_MODEL_TYPE=""
HF_TEXT_MODEL_TYPE=""
HF_TORCH_DTYPE=""
HF_MAX_POSITIONS=""
if [[ -f $HF_MODEL_DIR/config.json ]]; then
  require_tool python3 "it reads $HF_MODEL_DIR/config.json"
  # One key=value per line; values are plain words, so a read loop is enough.
  hf_facts=$(python3 - "$HF_MODEL_DIR/config.json" <<'PY'
import json, sys
with open(sys.argv[1], encoding="utf-8") as f:
    cfg = json.load(f)
# Multimodal and some newer configs nest the language model's settings.
text = cfg.get("text_config") or {}
def pick(key):
    value = cfg.get(key, text.get(key))
    return "" if value is None else str(value)
print("model_type=" + pick("model_type"))
# A vision-language model's language model (llava's is llama): its convert_checkpoint.py family.
print("text_model_type=" + str(text.get("model_type") or ""))
# transformers 5 writes `dtype`; older versions wrote `torch_dtype`.
print("torch_dtype=" + (pick("torch_dtype") or pick("dtype")))
print("max_position_embeddings=" + pick("max_position_embeddings"))
PY
  ) || die "cannot read $HF_MODEL_DIR/config.json as JSON"
  while IFS='=' read -r key value; do
    case $key in
      model_type) HF_MODEL_TYPE=$value ;;
      text_model_type) HF_TEXT_MODEL_TYPE=$value ;;
      torch_dtype) HF_TORCH_DTYPE=$value ;;
      max_position_embeddings) HF_MAX_POSITIONS=$value ;;
    esac
  done <<<"$hf_facts"
elif [[ $DRY_RUN == 1 && -n $HF_MODEL_ID ]]; then
  [[ -n $MODEL_FAMILY && $DTYPE != auto ]] ||
    die "dry run: $HF_MODEL_ID is not downloaded yet, so its config.json cannot be read; pass --family and --dtype"
  note "dry run: $HF_MODEL_ID is not downloaded yet; using --family $MODEL_FAMILY and --dtype $DTYPE"
elif [[ -d $HF_MODEL_DIR ]]; then
  die "$HF_MODEL_DIR has no config.json: is it a Hugging Face model directory?"
elif [[ $DRY_RUN == 1 && -n $MODEL_FAMILY && $DTYPE != auto ]]; then
  note "dry run: $HF_MODEL_DIR does not exist here; continuing because --family and --dtype are given"
else
  die "Hugging Face model directory not found: $HF_MODEL_DIR"
fi

# --- vision-language models: the visual engine's type and the language model's family ----------------------
if [[ $MULTIMODAL_TYPE == auto ]]; then
  # config.json model_type -> build_multimodal_engine.py --model_type, for the types whose LLM part
  # takes the visual features as a prompt table (the decoder-only ones).
  case $HF_MODEL_TYPE in
    llava) MULTIMODAL_TYPE=llava ;;
    llava_next) MULTIMODAL_TYPE=llava_next ;;
    llava_onevision) MULTIMODAL_TYPE=llava_onevision ;;
    qwen2_vl) MULTIMODAL_TYPE=qwen2_vl ;;
    blip-2) MULTIMODAL_TYPE=blip2 ;;
    phi3_v) MULTIMODAL_TYPE=phi-3-vision ;;
    "") die "--multimodal auto: config.json has no model_type; pass --multimodal TYPE" ;;
    *) die "--multimodal auto: model_type '$HF_MODEL_TYPE' has no known visual engine type; pass --multimodal TYPE (build_multimodal_engine.py --model_type)" ;;
  esac
fi
if [[ -n $MULTIMODAL_TYPE ]]; then
  if [[ -z $IMAGE_FEATURES ]]; then
    # Prompt-table rows per image in TensorRT-LLM's multimodal examples; other types vary with the
    # image size or the model, so they must be told.
    case $MULTIMODAL_TYPE in
      llava) IMAGE_FEATURES=576 ;;
      vila) IMAGE_FEATURES=196 ;;
      blip2) IMAGE_FEATURES=32 ;;
      *) die "--multimodal $MULTIMODAL_TYPE: pass --image-features (visual features one image takes; the engine's --max_multimodal_len is max batch size * features * --max-images)" ;;
    esac
  fi
  MAX_MULTIMODAL_LEN=$((MAX_BATCH_SIZE * IMAGE_FEATURES * MAX_IMAGES))
  [[ -n $MODEL_FAMILY || -z $HF_TEXT_MODEL_TYPE ]] || HF_MODEL_TYPE=$HF_TEXT_MODEL_TYPE
fi

if [[ -z $MODEL_FAMILY ]]; then
  # Families whose convert_checkpoint.py takes --model_dir/--output_dir/--dtype/--tp_size/--pp_size.
  case $HF_MODEL_TYPE in
    llama | mistral | mixtral) MODEL_FAMILY=llama ;;
    qwen | qwen2 | qwen2_moe) MODEL_FAMILY=qwen ;;
    gpt2 | gpt_bigcode) MODEL_FAMILY=gpt ;;
    phi | phi3) MODEL_FAMILY=phi ;;
    "") die "cannot tell the model family: config.json has no model_type; pass --family" ;;
    *) die "model_type '$HF_MODEL_TYPE' has no known convert_checkpoint.py family; pass --family (llama, qwen, gpt, phi) or --convert-script" ;;
  esac
fi

if [[ $DTYPE == auto ]]; then
  case $HF_TORCH_DTYPE in
    bfloat16) DTYPE=bfloat16 ;;
    float16 | float32 | "") DTYPE=float16 ;;
    *) die "config.json torch_dtype '$HF_TORCH_DTYPE' is not float16, bfloat16 or float32; pass --dtype" ;;
  esac
fi

# Engine limits: defaults never exceed the model's context; explicit values are checked, not changed.
if [[ -n $HF_MAX_POSITIONS ]] && is_uint "$HF_MAX_POSITIONS"; then
  if [[ -z $MAX_SEQ_LEN ]]; then
    MAX_SEQ_LEN=$((HF_MAX_POSITIONS < 8192 ? HF_MAX_POSITIONS : 8192))
  elif [[ $MAX_SEQ_LEN -gt $HF_MAX_POSITIONS ]]; then
    note "warning: --max-seq-len $MAX_SEQ_LEN exceeds the model's max_position_embeddings $HF_MAX_POSITIONS"
  fi
fi
MAX_SEQ_LEN=${MAX_SEQ_LEN:-8192}
if [[ -z $MAX_INPUT_LEN ]]; then
  MAX_INPUT_LEN=$((MAX_SEQ_LEN < 4096 ? MAX_SEQ_LEN : 4096))
fi
[[ $MAX_INPUT_LEN -le $MAX_SEQ_LEN ]] || die "--max-input-len $MAX_INPUT_LEN exceeds --max-seq-len $MAX_SEQ_LEN"

# --- tools, GPUs, TensorRT-LLM version -----------------------------------------------------------------
INSTALLED_TRTLLM=""
GPU_IDENTITY="not checked (dry run)"
if [[ $DRY_RUN == 0 ]]; then
  require_tool python3 "run inside the NGC tritonserver:<yy.mm>-trtllm-python-py3 container"
  require_tool trtllm-build "it ships with the tensorrt_llm wheel; run inside the NGC trtllm container"
  require_tool nvidia-smi "building an engine needs an NVIDIA GPU and driver (docker run --gpus all ...)"
  # Engines are compiled for one GPU architecture: the GPU model is part of the cache key.
  GPU_IDENTITY=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | sort -u) ||
    GPU_IDENTITY=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort -u) ||
    die "nvidia-smi cannot query the GPUs"
  gpu_count=$(nvidia-smi --list-gpus 2>/dev/null | grep -c '^GPU') || gpu_count=0
  [[ $gpu_count -ge 1 ]] || die "nvidia-smi lists no GPU"
  if [[ $gpu_count -lt $WORLD_SIZE ]]; then
    note "warning: $gpu_count GPU(s) visible for a $WORLD_SIZE-rank engine: ranks are built one after another"
  fi
fi
if INSTALLED_TRTLLM=$(python3 -c 'from importlib.metadata import version; print(version("tensorrt_llm"))' 2>/dev/null); then
  if [[ -n $TRTLLM_VERSION && $TRTLLM_VERSION != "$INSTALLED_TRTLLM" ]]; then
    die "--trtllm-version $TRTLLM_VERSION, but tensorrt_llm $INSTALLED_TRTLLM is installed: the examples and engine must match the runtime"
  fi
  TRTLLM_VERSION=$INSTALLED_TRTLLM
elif [[ $DRY_RUN == 0 ]]; then
  die "the tensorrt_llm Python package is not installed: run inside the NGC trtllm container"
fi

# --- locate convert_checkpoint.py ------------------------------------------------------------------------
locate_convert_script() {
  local examples=$1
  # TensorRT-LLM moved the model examples to examples/models/core/<family> in 2025.
  local candidate
  for candidate in "$examples/models/core/$MODEL_FAMILY/convert_checkpoint.py" "$examples/$MODEL_FAMILY/convert_checkpoint.py"; do
    if [[ -f $candidate ]]; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

FETCH_DEST=""
# The examples' root, for the visual engine's build script (empty: only --convert-script was given).
EXAMPLES_ROOT=$TRTLLM_EXAMPLES_DIR
if [[ -n $CONVERT_SCRIPT ]]; then
  [[ -f $CONVERT_SCRIPT || $DRY_RUN == 1 ]] || die "--convert-script not found: $CONVERT_SCRIPT"
elif [[ -n $TRTLLM_EXAMPLES_DIR ]]; then
  if [[ -d $TRTLLM_EXAMPLES_DIR ]]; then
    CONVERT_SCRIPT=$(locate_convert_script "$TRTLLM_EXAMPLES_DIR") ||
      die "no convert_checkpoint.py for family '$MODEL_FAMILY' under $TRTLLM_EXAMPLES_DIR (looked in models/core/$MODEL_FAMILY/ and $MODEL_FAMILY/)"
  elif [[ $DRY_RUN == 1 ]]; then
    note "dry run: $TRTLLM_EXAMPLES_DIR does not exist here; assuming the models/core/<family> layout"
    CONVERT_SCRIPT=$TRTLLM_EXAMPLES_DIR/models/core/$MODEL_FAMILY/convert_checkpoint.py
  else
    die "--examples-dir not found: $TRTLLM_EXAMPLES_DIR"
  fi
else
  # Without --examples-dir the examples live in the cache, one checkout per TensorRT-LLM version:
  # --fetch-examples clones them there, and an offline host can copy them there by hand.
  [[ -n $TRTLLM_VERSION ]] || die "cannot name the TensorRT-LLM examples to use: tensorrt_llm is not installed here; pass --trtllm-version or --examples-dir"
  cached_examples=$ENGINE_CACHE_DIR/src/TensorRT-LLM-v$TRTLLM_VERSION
  EXAMPLES_ROOT=$cached_examples/examples
  if [[ -d $cached_examples/examples ]]; then
    CONVERT_SCRIPT=$(locate_convert_script "$cached_examples/examples") ||
      die "no convert_checkpoint.py for family '$MODEL_FAMILY' in $cached_examples/examples"
  elif [[ $TRTLLM_FETCH_EXAMPLES == 1 ]]; then
    FETCH_DEST=$cached_examples
    CONVERT_SCRIPT=$FETCH_DEST/examples/models/core/$MODEL_FAMILY/convert_checkpoint.py
  else
    die "convert_checkpoint.py comes from the TensorRT-LLM examples, which the NGC image does not ship: pass --examples-dir (examples/ of a TensorRT-LLM checkout at tag v$TRTLLM_VERSION), or --fetch-examples to clone it into $cached_examples, or copy such a checkout there"
  fi
fi

if [[ -n $FETCH_DEST ]]; then
  [[ $DRY_RUN == 1 ]] || require_tool git "--fetch-examples clones $TRTLLM_GIT_URL"
  note "fetching the TensorRT-LLM v$TRTLLM_VERSION examples into $FETCH_DEST"
  run rm -rf "$FETCH_DEST.partial"
  # Sparse, shallow and without LFS blobs: only examples/ is needed, not the multi-GB history.
  run env GIT_LFS_SKIP_SMUDGE=1 git clone --quiet --depth 1 --filter=blob:none --sparse \
    --branch "v$TRTLLM_VERSION" "$TRTLLM_GIT_URL" "$FETCH_DEST.partial"
  if [[ -n $MULTIMODAL_TYPE ]]; then
    # The multimodal repository's models (preprocessing with the image processor, the encoders).
    run git -C "$FETCH_DEST.partial" sparse-checkout set examples triton_backend/all_models
  else
    run git -C "$FETCH_DEST.partial" sparse-checkout set examples
  fi
  run mv "$FETCH_DEST.partial" "$FETCH_DEST"
  if [[ $DRY_RUN == 0 ]]; then
    CONVERT_SCRIPT=$(locate_convert_script "$FETCH_DEST/examples") ||
      die "no convert_checkpoint.py for family '$MODEL_FAMILY' in the fetched $FETCH_DEST/examples"
  fi
fi

# The visual engine's build script and upstream's multimodal models, found before any build work.
VISUAL_SCRIPT=""
if [[ -n $MULTIMODAL_TYPE ]]; then
  [[ -n $EXAMPLES_ROOT ]] || die "--multimodal needs the TensorRT-LLM examples (build_multimodal_engine.py): pass --examples-dir"
  for candidate in "$EXAMPLES_ROOT/models/core/multimodal/build_multimodal_engine.py" "$EXAMPLES_ROOT/multimodal/build_multimodal_engine.py"; do
    if [[ -f $candidate ]]; then
      VISUAL_SCRIPT=$candidate
      break
    fi
  done
  if [[ -z $VISUAL_SCRIPT ]]; then
    [[ $DRY_RUN == 1 || -n $FETCH_DEST ]] || die "no build_multimodal_engine.py under $EXAMPLES_ROOT (looked in models/core/multimodal/ and multimodal/)"
    VISUAL_SCRIPT=$EXAMPLES_ROOT/models/core/multimodal/build_multimodal_engine.py
  fi
  if [[ -n $MODEL_REPO_DIR ]]; then
    TRTLLM_TRITON_MODELS_DIR=${TRTLLM_TRITON_MODELS_DIR:-${EXAMPLES_ROOT%/examples}/triton_backend/all_models}
    [[ -d $TRTLLM_TRITON_MODELS_DIR/multimodal || $DRY_RUN == 1 || -n $FETCH_DEST ]] ||
      die "no multimodal/ under $TRTLLM_TRITON_MODELS_DIR: pass --triton-models-dir (TensorRT-LLM's triton_backend/all_models, a release up to 1.2)"
  fi
fi

# The renderer runs last, after hours of building: make sure it can run before starting.
if [[ -n $MODEL_REPO_DIR && $DRY_RUN == 0 ]]; then
  PYTHONPATH=$DEPLOY_PYTHONPATH "$DEPLOY_PYTHON" -c 'import deploy.model_repo' 2>/dev/null ||
    die "the repository renderer (deploy.model_repo) does not import with DEPLOY_PYTHONPATH=$DEPLOY_PYTHONPATH: use the trtllm-gateway-triton image (deploy/triton.Dockerfile), or pip install --target DIR 'tritonclient[grpc]' and set DEPLOY_PYTHONPATH=DIR:<this repository>"
fi

# --- paged KV cache flag ---------------------------------------------------------------------------------------
if [[ $KV_CACHE_FLAG == auto ]]; then
  if [[ $DRY_RUN == 0 ]]; then
    # --kv_cache_type replaced --paged_kv_cache (now deprecated); older releases only know the latter.
    if trtllm-build --help 2>/dev/null | grep -q -- '--kv_cache_type'; then
      KV_CACHE_FLAG=kv_cache_type
    else
      KV_CACHE_FLAG=paged_kv_cache
    fi
  else
    note "dry run: assuming trtllm-build knows --kv_cache_type (--kv-cache-flag paged_kv_cache for older releases)"
    KV_CACHE_FLAG=kv_cache_type
  fi
fi
if [[ $KV_CACHE_FLAG == kv_cache_type ]]; then
  KV_ARGS=(--kv_cache_type paged)
else
  KV_ARGS=(--paged_kv_cache enable)
fi

# --- cache keys ----------------------------------------------------------------------------------------------------
file_sha() {
  if [[ -f $1 ]]; then sha256sum "$1" | cut -c1-64; else echo "absent"; fi
}
# Weights are identified by name and size: hashing tens of GB on every run would cost minutes.
weights_listing() {
  if [[ -d $HF_MODEL_DIR ]]; then
    find "$HF_MODEL_DIR" -maxdepth 1 -type f \( -name '*.safetensors' -o -name '*.bin' -o -name '*.pt' -o -name '*.pth' -o -name '*.index.json' \) \
      -printf '%f %s\n' | LC_ALL=C sort | sha256_of_text
  else
    echo "absent"
  fi
}

CONVERT_MANIFEST=$(
  cat <<EOF
step=convert
tensorrt_llm=${TRTLLM_VERSION:-unknown}
family=$MODEL_FAMILY
convert_script=$(file_sha "$CONVERT_SCRIPT")
hf_config=$(file_sha "$HF_MODEL_DIR/config.json")
hf_weights=$(weights_listing)
dtype=$DTYPE
tp_size=$TP_SIZE
pp_size=$PP_SIZE
convert_args=${CONVERT_ARGS[*]:-}
EOF
)
CONVERT_KEY=$(printf '%s\n' "$CONVERT_MANIFEST" | sha256_of_text)
CKPT_DIR=$ENGINE_CACHE_DIR/checkpoints/$MODEL_NAME-$DTYPE-tp$TP_SIZE-pp$PP_SIZE-${CONVERT_KEY:0:12}

# Paged context FMHA is what lets Triton reuse KV-cache blocks across requests (enable_kv_cache_reuse);
# it exists for half-precision attention only.
BUILD_FLAGS=(
  --gemm_plugin "$DTYPE"
  --gpt_attention_plugin "$DTYPE"
  "${KV_ARGS[@]}"
  --remove_input_padding enable
  --context_fmha enable
  --use_paged_context_fmha enable
  --max_batch_size "$MAX_BATCH_SIZE"
  --max_input_len "$MAX_INPUT_LEN"
  --max_seq_len "$MAX_SEQ_LEN"
  --max_num_tokens "$MAX_NUM_TOKENS"
  --max_beam_width 1
  --workers "$BUILD_WORKERS"
)
if [[ -n $MULTIMODAL_TYPE ]]; then
  # Rows of the prompt table the engine takes per batch: the visual features stand in for the
  # image placeholders there.
  BUILD_FLAGS+=(--max_multimodal_len "$MAX_MULTIMODAL_LEN")
fi
if [[ ${#BUILD_ARGS[@]} -gt 0 ]]; then
  BUILD_FLAGS+=("${BUILD_ARGS[@]}")
fi

BUILD_MANIFEST=$(
  cat <<EOF
step=build
convert_key=$CONVERT_KEY
tensorrt_llm=${TRTLLM_VERSION:-unknown}
gpus=$GPU_IDENTITY
build_flags=${BUILD_FLAGS[*]}
EOF
)
BUILD_KEY=$(printf '%s\n' "$BUILD_MANIFEST" | sha256_of_text)
ENGINE_DIR=$ENGINE_CACHE_DIR/engines/$MODEL_NAME-$DTYPE-tp$TP_SIZE-pp$PP_SIZE-${BUILD_KEY:0:12}

# --- step 1: convert -----------------------------------------------------------------------------------------------
# Each step writes to <dir>.partial and renames on success, so an interrupted run is never mistaken for a done one.
if [[ $FORCE == 0 && -f $CKPT_DIR/.complete ]]; then
  note "checkpoint cached: $CKPT_DIR"
else
  note "converting $HF_MODEL_DIR ($MODEL_FAMILY, $DTYPE, tp=$TP_SIZE pp=$PP_SIZE) -> $CKPT_DIR"
  run rm -rf "$CKPT_DIR.partial" "$CKPT_DIR"
  run mkdir -p "$CKPT_DIR.partial"
  convert_cmd=(python3 "$CONVERT_SCRIPT"
    --model_dir "$HF_MODEL_DIR"
    --output_dir "$CKPT_DIR.partial"
    --dtype "$DTYPE"
    --tp_size "$TP_SIZE"
    --pp_size "$PP_SIZE")
  if [[ ${#CONVERT_ARGS[@]} -gt 0 ]]; then
    convert_cmd+=("${CONVERT_ARGS[@]}")
  fi
  run "${convert_cmd[@]}"
  if [[ $DRY_RUN == 0 ]]; then
    printf '%s\n' "$CONVERT_MANIFEST" >"$CKPT_DIR.partial/.complete"
  fi
  run mv "$CKPT_DIR.partial" "$CKPT_DIR"
fi

# --- step 2: build ---------------------------------------------------------------------------------------------------
if [[ $FORCE == 0 && -f $ENGINE_DIR/.complete ]]; then
  note "engine cached: $ENGINE_DIR"
else
  note "building $ENGINE_DIR"
  run rm -rf "$ENGINE_DIR.partial" "$ENGINE_DIR"
  run trtllm-build --checkpoint_dir "$CKPT_DIR" --output_dir "$ENGINE_DIR.partial" "${BUILD_FLAGS[@]}"
  if [[ $DRY_RUN == 0 ]]; then
    [[ -f $ENGINE_DIR.partial/config.json ]] || die "trtllm-build wrote no config.json in $ENGINE_DIR.partial"
    printf '%s\n' "$BUILD_MANIFEST" >"$ENGINE_DIR.partial/.complete"
  fi
  run mv "$ENGINE_DIR.partial" "$ENGINE_DIR"
fi

# --- step 2b: the visual engine (vision-language models) ----------------------------------------------------------------------
VISUAL_DIR=""
if [[ -n $MULTIMODAL_TYPE ]]; then
  # One visual engine per image the batch can hold: the encoder runs on images, not on requests.
  VISUAL_BATCH=$((MAX_BATCH_SIZE * MAX_IMAGES))
  VISUAL_MANIFEST=$(
    cat <<EOF
step=visual
tensorrt_llm=${TRTLLM_VERSION:-unknown}
script=$(file_sha "$VISUAL_SCRIPT")
hf_config=$(file_sha "$HF_MODEL_DIR/config.json")
hf_weights=$(weights_listing)
model_type=$MULTIMODAL_TYPE
max_batch_size=$VISUAL_BATCH
gpus=$GPU_IDENTITY
EOF
  )
  VISUAL_KEY=$(printf '%s\n' "$VISUAL_MANIFEST" | sha256_of_text)
  VISUAL_DIR=$ENGINE_CACHE_DIR/visual/$MODEL_NAME-$MULTIMODAL_TYPE-${VISUAL_KEY:0:12}
  if [[ $FORCE == 0 && -f $VISUAL_DIR/.complete ]]; then
    note "visual engine cached: $VISUAL_DIR"
  else
    note "building the visual engine ($MULTIMODAL_TYPE) $VISUAL_DIR"
    run rm -rf "$VISUAL_DIR.partial" "$VISUAL_DIR"
    run python3 "$VISUAL_SCRIPT" --model_type "$MULTIMODAL_TYPE" --model_path "$HF_MODEL_DIR" \
      --output_dir "$VISUAL_DIR.partial" --max_batch_size "$VISUAL_BATCH"
    if [[ $DRY_RUN == 0 ]]; then
      [[ -n $(find "$VISUAL_DIR.partial" -maxdepth 1 -name '*.engine' -print -quit 2>/dev/null) ]] ||
        die "build_multimodal_engine.py wrote no .engine file in $VISUAL_DIR.partial"
      printf '%s\n' "$VISUAL_MANIFEST" >"$VISUAL_DIR.partial/.complete"
    fi
    run mv "$VISUAL_DIR.partial" "$VISUAL_DIR"
  fi
fi

# --- step 3: model repository ----------------------------------------------------------------------------------------------
if [[ -n $MODEL_REPO_DIR && -n $MULTIMODAL_TYPE ]]; then
  [[ -d $TOKENIZER_DIR || $DRY_RUN == 1 ]] || die "tokenizer directory not found: $TOKENIZER_DIR"
  ENCODER_DTYPE=TYPE_FP16
  [[ $MULTIMODAL_TYPE != mllama ]] || ENCODER_DTYPE=TYPE_BF16
  render_cmd=(env "PYTHONPATH=$DEPLOY_PYTHONPATH" "$DEPLOY_PYTHON" -m deploy.model_repo render-multimodal
    --upstream "$TRTLLM_TRITON_MODELS_DIR"
    --out "$MODEL_REPO_DIR"
    --overwrite
    --engine-dir "${ENGINE_DIR_AT_SERVE:-$ENGINE_DIR}"
    --visual-engine-dir "${VISUAL_ENGINE_DIR_AT_SERVE:-$VISUAL_DIR}"
    --hf-model-dir "${TOKENIZER_DIR_AT_SERVE:-$TOKENIZER_DIR}"
    --max-batch-size "$MAX_BATCH_SIZE"
    --max-num-images "$MAX_IMAGES"
    --kv-cache-free-gpu-mem-fraction "$KV_CACHE_FREE_GPU_MEM_FRACTION"
    --batch-scheduler-policy "$BATCH_SCHEDULER_POLICY"
    --encoder-dtype "$ENCODER_DTYPE")
  for kv in "${RENDER_SETS[@]}"; do
    render_cmd+=(--set "$kv")
  done
  note "rendering the C++ multimodal model repository into $MODEL_REPO_DIR"
  run "${render_cmd[@]}"
elif [[ -n $MODEL_REPO_DIR ]]; then
  [[ -d $TOKENIZER_DIR || $DRY_RUN == 1 ]] || die "tokenizer directory not found: $TOKENIZER_DIR"
  render_cmd=(env "PYTHONPATH=$DEPLOY_PYTHONPATH" "$DEPLOY_PYTHON" -m deploy.model_repo render
    --backend tensorrtllm
    --variant "$REPO_VARIANT"
    --out "$MODEL_REPO_DIR"
    --overwrite
    --set "engine_dir=${ENGINE_DIR_AT_SERVE:-$ENGINE_DIR}"
    --set "tokenizer_dir=${TOKENIZER_DIR_AT_SERVE:-$TOKENIZER_DIR}"
    --set "max_batch_size=$MAX_BATCH_SIZE"
    --set "decoupled=true"
    --set "exclude_input_in_output=true"
    --set "kv_cache_free_gpu_mem_fraction=$KV_CACHE_FREE_GPU_MEM_FRACTION"
    --set "enable_kv_cache_reuse=true"
    --set "batch_scheduler_policy=$BATCH_SCHEDULER_POLICY")
  for kv in "${RENDER_SETS[@]}"; do
    render_cmd+=(--set "$kv")
  done
  note "rendering the Triton model repository into $MODEL_REPO_DIR"
  run "${render_cmd[@]}"
fi

note "engine: $ENGINE_DIR"
echo "ENGINE_DIR=$ENGINE_DIR"
if [[ -n $VISUAL_DIR ]]; then
  echo "VISUAL_ENGINE_DIR=$VISUAL_DIR"
fi
if [[ -n $MODEL_REPO_DIR ]]; then
  echo "MODEL_REPO_DIR=$MODEL_REPO_DIR"
fi
