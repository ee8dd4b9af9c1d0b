#!/usr/bin/env bash
# Serve a Hugging Face model with TensorRT-LLM's llmapi Python model (the LLM API's PyTorch backend)
# in Triton: render the model repository (config.pbtxt, model.yaml, upstream's model files), then run
# tritonserver in the foreground (exec: signals reach it directly, so it can be a container's main
# process).
#
#   one GPU, or tensor parallel on one node:  tritonserver (the LLM API starts its own workers)
#   several nodes under Slurm:                srun --mpi=pmix -N NODES --ntasks-per-node=GPUS \
#                                               trtllm-llmapi-launch tritonserver ...
# as TensorRT-LLM's own Slurm examples launch the LLM API: one MPI task per GPU, rank 0 serving.
set -euo pipefail

PROG=launch_llmapi
HERE=${BASH_SOURCE[0]%/*}
[[ $HERE == "${BASH_SOURCE[0]}" ]] && HERE=.
# shellcheck source=deploy/common.sh
source "$HERE/common.sh"

usage() {
  cat <<EOF
Usage: deploy/launch_llmapi.sh --model-repo DIR [--hf-model MODEL [render options]] [options] [-- tritonserver args]

  --model-repo DIR        the llmapi model repository (rendered here with --hf-model)   [MODEL_REPO_DIR]
  --hf-model MODEL        render the repository first for this Hugging Face id or local
                          directory (model.yaml's model)                                [HF_MODEL]
  --upstream DIR          upstream's triton_backend/all_models/llmapi/tensorrt_llm, copied
                          unchanged into the repository                                 [LLMAPI_UPSTREAM_DIR]
  --name NAME             the model's name in Triton (default tensorrt_llm)             [LLMAPI_MODEL_NAME]
  --tp N                  tensor_parallel_size (default 1)                               [TP_SIZE]
  --pp N                  pipeline_parallel_size (default 1)                             [PP_SIZE]
  --max-batch-size N      the LLM API's batch limit (default 64)                         [MAX_BATCH_SIZE]
  --no-kv-cache-reuse     turn KV cache block reuse off (default on)
  --no-decoupled          answer each request once (default: decoupled, streaming)
  --multimodal            a vision-language model: model.yaml's triton_config.multimodal,
                          so the model reads the image_url input                         [LLMAPI_MULTIMODAL=1]
  --profile P             current | v1.2: which upstream config.pbtxt (default current)  [LLMAPI_PROFILE]
  --slurm                 several nodes: srun --mpi=pmix ... trtllm-llmapi-launch tritonserver
  --nodes N               with --slurm: nodes (default 1)                                [SLURM_NODES]
  --gpus-per-node N       with --slurm: MPI tasks per node (default: tp*pp / nodes)      [GPUS_PER_NODE]
  --srun-arg ARG          extra srun argument (repeatable), e.g. --container-image=IMAGE
  --http-port N           default 8000                                                   [TRITON_HTTP_PORT]
  --grpc-port N           default 8001                                                   [TRITON_GRPC_PORT]
  --metrics-port N        default 8002                                                   [TRITON_METRICS_PORT]
  --tritonserver PATH     default /opt/tritonserver/bin/tritonserver                     [TRITONSERVER]
  --python PATH           the Python that renders the repository (default python3)      [PYTHON]
  --dry-run               print the commands and exit; nothing is checked or run
  -h, --help              this text
Arguments after -- go to tritonserver.
EOF
}

MODEL_REPO_DIR=${MODEL_REPO_DIR:-}
HF_MODEL=${HF_MODEL:-}
LLMAPI_UPSTREAM_DIR=${LLMAPI_UPSTREAM_DIR:-}
LLMAPI_MODEL_NAME=${LLMAPI_MODEL_NAME:-tensorrt_llm}
TP_SIZE=${TP_SIZE:-1}
PP_SIZE=${PP_SIZE:-1}
MAX_BATCH_SIZE=${MAX_BATCH_SIZE:-64}
LLMAPI_PROFILE=${LLMAPI_PROFILE:-current}
SLURM_NODES=${SLURM_NODES:-1}
GPUS_PER_NODE=${GPUS_PER_NODE:-}
TRITON_HTTP_PORT=${TRITON_HTTP_PORT:-8000}
TRITON_GRPC_PORT=${TRITON_GRPC_PORT:-8001}
TRITON_METRICS_PORT=${TRITON_METRICS_PORT:-8002}
TRITONSERVER=${TRITONSERVER:-/opt/tritonserver/bin/tritonserver}
PYTHON=${PYTHON:-python3}
KV_REUSE=1
DECOUPLED=1
LLMAPI_MULTIMODAL=${LLMAPI_MULTIMODAL:-0}
SLURM=0
DRY_RUN=0
SRUN_ARGS=()
EXTRA_ARGS=()

while [[ $# -gt 0 ]]; do
  case $1 in
    --model-repo) need_value "$@"; MODEL_REPO_DIR=$2; shift 2 ;;
    --hf-model) need_value "$@"; HF_MODEL=$2; shift 2 ;;
    --upstream) need_value "$@"; LLMAPI_UPSTREAM_DIR=$2; shift 2 ;;
    --name) need_value "$@"; LLMAPI_MODEL_NAME=$2; shift 2 ;;
    --tp) need_value "$@"; TP_SIZE=$2; shift 2 ;;
    --pp) need_value "$@"; PP_SIZE=$2; shift 2 ;;
    --max-batch-size) need_value "$@"; MAX_BATCH_SIZE=$2; shift 2 ;;
    --no-kv-cache-reuse) KV_REUSE=0; shift ;;
    --no-decoupled) DECOUPLED=0; shift ;;
    --multimodal) LLMAPI_MULTIMODAL=1; shift ;;
    --profile) need_value "$@"; LLMAPI_PROFILE=$2; shift 2 ;;
    --slurm) SLURM=1; shift ;;
    --nodes) need_value "$@"; SLURM_NODES=$2; shift 2 ;;
    --gpus-per-node) need_value "$@"; GPUS_PER_NODE=$2; shift 2 ;;
    --srun-arg) need_value "$@"; SRUN_ARGS+=("$2"); shift 2 ;;
    --http-port) need_value "$@"; TRITON_HTTP_PORT=$2; shift 2 ;;
    --grpc-port) need_value "$@"; TRITON_GRPC_PORT=$2; shift 2 ;;
    --metrics-port) need_value "$@"; TRITON_METRICS_PORT=$2; shift 2 ;;
    --tritonserver) need_value "$@"; TRITONSERVER=$2; shift 2 ;;
    --python) need_value "$@"; PYTHON=$2; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; EXTRA_ARGS=("$@"); break ;;
    *) usage >&2; die "unknown option: $1" ;;
  esac
done

[[ -n $MODEL_REPO_DIR ]] || { usage >&2; die "--model-repo is required"; }
for pair in "--tp:$TP_SIZE" "--pp:$PP_SIZE" "--max-batch-size:$MAX_BATCH_SIZE" "--nodes:$SLURM_NODES" \
  "--http-port:$TRITON_HTTP_PORT" "--grpc-port:$TRITON_GRPC_PORT" "--metrics-port:$TRITON_METRICS_PORT"; do
  require_uint "${pair%%:*}" "${pair#*:}"
done
[[ $LLMAPI_PROFILE == current || $LLMAPI_PROFILE == v1.2 ]] || die "--profile must be current or v1.2, got '$LLMAPI_PROFILE'"
MODEL_REPO_DIR=${MODEL_REPO_DIR%/}
WORLD_SIZE=$((TP_SIZE * PP_SIZE))
if [[ $SLURM == 1 ]]; then
  if [[ -z $GPUS_PER_NODE ]]; then
    [[ $((WORLD_SIZE % SLURM_NODES)) == 0 ]] ||
      die "tp*pp = $WORLD_SIZE GPUs do not split evenly over $SLURM_NODES nodes; pass --gpus-per-node"
    GPUS_PER_NODE=$((WORLD_SIZE / SLURM_NODES))
  fi
  require_uint --gpus-per-node "$GPUS_PER_NODE"
  # The LLM API asserts one MPI process per rank of the model.
  [[ $((SLURM_NODES * GPUS_PER_NODE)) == "$WORLD_SIZE" ]] ||
    die "--nodes $SLURM_NODES x --gpus-per-node $GPUS_PER_NODE tasks, but tp*pp is $WORLD_SIZE"
elif [[ $SLURM_NODES != 1 ]]; then
  die "--nodes needs --slurm (several nodes run under srun)"
fi

# --- render ---------------------------------------------------------------------------------------------
RENDER=()
if [[ -n $HF_MODEL ]]; then
  RENDER=("$PYTHON" -m deploy.model_repo render-llmapi --model "$HF_MODEL" --out "$MODEL_REPO_DIR"
    --name "$LLMAPI_MODEL_NAME" --profile "$LLMAPI_PROFILE" --tensor-parallel-size "$TP_SIZE"
    --pipeline-parallel-size "$PP_SIZE" --max-batch-size "$MAX_BATCH_SIZE" --overwrite)
  [[ $KV_REUSE == 1 ]] || RENDER+=(--no-kv-cache-reuse)
  [[ $DECOUPLED == 1 ]] || RENDER+=(--no-decoupled)
  [[ $LLMAPI_MULTIMODAL != 1 ]] || RENDER+=(--multimodal)
  [[ -z $LLMAPI_UPSTREAM_DIR ]] || RENDER+=(--upstream "$LLMAPI_UPSTREAM_DIR")
fi

# --- serve ----------------------------------------------------------------------------------------------
# Auto-complete stays on: upstream's model.py takes decoupled and max_batch_size from model.yaml.
SERVER=("$TRITONSERVER" "--model-repository=$MODEL_REPO_DIR" "--http-port=$TRITON_HTTP_PORT"
  "--grpc-port=$TRITON_GRPC_PORT" "--metrics-port=$TRITON_METRICS_PORT")
if [[ ${#EXTRA_ARGS[@]} -gt 0 ]]; then
  SERVER+=("${EXTRA_ARGS[@]}")
fi
if [[ $SLURM == 1 ]]; then
  CMD=(srun --mpi=pmix "--nodes=$SLURM_NODES" "--ntasks-per-node=$GPUS_PER_NODE")
  if [[ ${#SRUN_ARGS[@]} -gt 0 ]]; then
    CMD+=("${SRUN_ARGS[@]}")
  fi
  CMD+=(trtllm-llmapi-launch "${SERVER[@]}")
else
  CMD=("${SERVER[@]}")
fi

if [[ $DRY_RUN == 1 ]]; then
  note "dry run: printing the commands only; nothing is checked or run"
  [[ ${#RENDER[@]} -eq 0 ]] || echo "+ $(shell_quote "${RENDER[@]}")"
  echo "+ $(shell_quote "${CMD[@]}")"
  exit 0
fi

if [[ ${#RENDER[@]} -gt 0 ]]; then
  echo "+ $(shell_quote "${RENDER[@]}")"
  # The image keeps the renderer's dependencies apart from the Python backend's (DEPLOY_PYTHONPATH).
  (cd "$HERE/.." && PYTHONPATH=${DEPLOY_PYTHONPATH:-.} "${RENDER[@]}") || die "rendering the repository failed"
fi
model_dir=$MODEL_REPO_DIR/$LLMAPI_MODEL_NAME
[[ -f $model_dir/config.pbtxt && -f $model_dir/1/model.yaml ]] ||
  die "$model_dir is not an llmapi model repository: pass --hf-model to render it"
[[ -f $model_dir/1/model.py ]] ||
  die "$model_dir/1 has no model.py: pass --upstream with TensorRT-LLM's triton_backend/all_models/llmapi/tensorrt_llm"
if [[ $SLURM == 1 ]]; then
  command -v srun >/dev/null 2>&1 || die "srun not found: --slurm runs under Slurm"
else
  [[ -x $TRITONSERVER ]] || die "tritonserver not found at $TRITONSERVER: run inside the NGC tritonserver:<yy.mm>-trtllm-python-py3 container"
fi
echo "+ $(shell_quote "${CMD[@]}")"
exec "${CMD[@]}"
