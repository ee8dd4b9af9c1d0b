#!/usr/bin/env bash
# Start Triton on a rendered TensorRT-LLM model repository: one tritonserver on one GPU, or one rank
# per GPU under mpirun for a tensor/pipeline-parallel engine. Waits until /v2/health/ready answers,
# stays in the foreground, and on SIGTERM/SIGINT stops every rank (then exits), so it can be a
# container's main process.
#
# With several ranks, rank 0 is the server clients see (HTTP, gRPC, metrics, all four models); the
# other ranks load only the tensorrt_llm model, serve no endpoint and run the engine's shards as the
# TensorRT-LLM backend's MPI workers. Each rank gets its own Python-backend shared-memory prefix so
# their stubs do not collide in /dev/shm.
set -euo pipefail

PROG=launch_triton
# Pure bash (no dirname): the scripts also run with a minimal PATH.
HERE=${BASH_SOURCE[0]%/*}
[[ $HERE == "${BASH_SOURCE[0]}" ]] && HERE=.
# shellcheck source=deploy/common.sh
source "$HERE/common.sh"

usage() {
  cat <<EOF
Usage: deploy/launch_triton.sh --model-repo DIR [options] [-- extra tritonserver arguments]

  --model-repo DIR        rendered model repository                                   [MODEL_REPO_DIR]
  --world-size N|auto     MPI ranks = GPUs = tp*pp of the engine (default auto: read from the
                          engine the repository's tensorrt_llm model points at)       [WORLD_SIZE]
  --http-port N           default 8000                                                [TRITON_HTTP_PORT]
  --grpc-port N           default 8001                                                [TRITON_GRPC_PORT]
  --metrics-port N        default 8002                                                [TRITON_METRICS_PORT]
  --tritonserver PATH     default /opt/tritonserver/bin/tritonserver                  [TRITONSERVER]
  --trtllm-model NAMES    models ranks > 0 load, comma-separated (default tensorrt_llm) [TRTLLM_MODEL_NAME]
  --exit-timeout S        tritonserver --exit-timeout-secs: how long in-flight requests may
                          finish after SIGTERM (default 30)                           [TRITON_EXIT_TIMEOUT]
  --ready-timeout S       give up if not ready after S seconds (default 1800)         [READY_TIMEOUT]
  --stop-timeout S        after SIGTERM, wait S seconds before SIGKILL (default 60)   [STOP_TIMEOUT]
                          (readiness is polled every READY_POLL_INTERVAL seconds, default 2)
  --http-send-buffer B    raise net.core.wmem_default to B bytes while tritonserver starts, back
                          after it is ready (default 33554432; 0: leave it): Triton's HTTP
                          frontend loses generate_stream responses under load when its
                          threads' command sockets fill (212992 bytes hold 278)  [TRITON_HTTP_SEND_BUFFER]
  --mpi-arg ARG           extra mpirun argument (repeatable), e.g. --oversubscribe
  --no-wait               do not poll readiness (still runs in the foreground)
  --dry-run               print the command line and exit; GPU and tool checks are skipped
  -h, --help              this text
Arguments after -- go to every tritonserver rank.
EOF
}


MODEL_REPO_DIR=${MODEL_REPO_DIR:-}
WORLD_SIZE=${WORLD_SIZE:-auto}
TRITON_HTTP_PORT=${TRITON_HTTP_PORT:-8000}
TRITON_GRPC_PORT=${TRITON_GRPC_PORT:-8001}
TRITON_METRICS_PORT=${TRITON_METRICS_PORT:-8002}
TRITONSERVER=${TRITONSERVER:-/opt/tritonserver/bin/tritonserver}
TRTLLM_MODEL_NAME=${TRTLLM_MODEL_NAME:-tensorrt_llm}
TRITON_EXIT_TIMEOUT=${TRITON_EXIT_TIMEOUT:-30}
READY_TIMEOUT=${READY_TIMEOUT:-1800}
STOP_TIMEOUT=${STOP_TIMEOUT:-60}
READY_POLL_INTERVAL=${READY_POLL_INTERVAL:-2}
TRITON_HTTP_SEND_BUFFER=${TRITON_HTTP_SEND_BUFFER:-33554432}
# The sysctl's file (a test points it elsewhere).
WMEM_DEFAULT_FILE=${WMEM_DEFAULT_FILE:-/proc/sys/net/core/wmem_default}
WAIT_READY=1
DRY_RUN=0
MPI_ARGS=()
EXTRA_ARGS=()

while [[ $# -gt 0 ]]; do
  case $1 in
    --model-repo) need_value "$@"; MODEL_REPO_DIR=$2; shift 2 ;;
    --world-size) need_value "$@"; WORLD_SIZE=$2; shift 2 ;;
    --http-port) need_value "$@"; TRITON_HTTP_PORT=$2; shift 2 ;;
    --grpc-port) need_value "$@"; TRITON_GRPC_PORT=$2; shift 2 ;;
    --metrics-port) need_value "$@"; TRITON_METRICS_PORT=$2; shift 2 ;;
    --tritonserver) need_value "$@"; TRITONSERVER=$2; shift 2 ;;
    --trtllm-model) need_value "$@"; TRTLLM_MODEL_NAME=$2; shift 2 ;;
    --exit-timeout) need_value "$@"; TRITON_EXIT_TIMEOUT=$2; shift 2 ;;
    --ready-timeout) need_value "$@"; READY_TIMEOUT=$2; shift 2 ;;
    --stop-timeout) need_value "$@"; STOP_TIMEOUT=$2; shift 2 ;;
    --http-send-buffer) need_value "$@"; TRITON_HTTP_SEND_BUFFER=$2; shift 2 ;;
    --mpi-arg) need_value "$@"; MPI_ARGS+=("$2"); shift 2 ;;
    --no-wait) WAIT_READY=0; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; EXTRA_ARGS=("$@"); break ;;
    *) usage >&2; die "unknown option: $1" ;;
  esac
done


[[ -n $MODEL_REPO_DIR ]] || { usage >&2; die "--model-repo is required"; }
for pair in "--http-port:$TRITON_HTTP_PORT" "--grpc-port:$TRITON_GRPC_PORT" "--metrics-port:$TRITON_METRICS_PORT" \
  "--exit-timeout:$TRITON_EXIT_TIMEOUT" "--ready-timeout:$READY_TIMEOUT" "--stop-timeout:$STOP_TIMEOUT"; do
  require_uint "${pair%%:*}" "${pair#*:}"
done
[[ $TRITON_HTTP_SEND_BUFFER =~ ^[0-9]+$ ]] ||
  die "--http-send-buffer must be a number of bytes (0: leave it), got '$TRITON_HTTP_SEND_BUFFER'"
MODEL_REPO_DIR=${MODEL_REPO_DIR%/}

if [[ $DRY_RUN == 1 ]]; then
  note "dry run: printing the command only; not checking the repository, tritonserver, mpirun or GPUs"
else
  [[ -d $MODEL_REPO_DIR ]] || die "model repository not found: $MODEL_REPO_DIR"
  [[ -f $MODEL_REPO_DIR/tensorrt_llm/config.pbtxt ]] ||
    die "$MODEL_REPO_DIR/tensorrt_llm/config.pbtxt not found: render the repository first (deploy/build_engine.sh --repo-out)"
  [[ -x $TRITONSERVER ]] || die "tritonserver not found at $TRITONSERVER: run inside the NGC tritonserver:<yy.mm>-trtllm-python-py3 container"
  command -v python3 >/dev/null 2>&1 || die "python3 not found: it reads the engine config and polls readiness"
  command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: Triton with TensorRT-LLM needs NVIDIA GPUs (docker run --gpus ...)"
fi

# --- world size: from the engine the repository points at -----------------------------------------------
if [[ $WORLD_SIZE == auto ]]; then
  [[ $DRY_RUN == 0 ]] || die "--dry-run needs an explicit --world-size"
  # The backend asserts MPI world size == tp*pp, so take it from the engine rather than from a guess.
  WORLD_SIZE=$(python3 - "$MODEL_REPO_DIR/tensorrt_llm/config.pbtxt" <<'PY'
import json, os, re, sys
text = open(sys.argv[1], encoding="utf-8").read()
# The stock key is gpt_model_path; a parameters block reads `key: "gpt_model_path" value: { string_value: "..." }`.
m = re.search(r'key:\s*"(?:gpt_model_path|engine_dir)"\s*value:\s*\{\s*string_value:\s*"([^"]*)"', text)
if not m or "${" in m.group(1):
    sys.exit("tensorrt_llm/config.pbtxt names no engine directory (gpt_model_path)")
cfg_path = os.path.join(m.group(1), "config.json")
try:
    cfg = json.load(open(cfg_path, encoding="utf-8"))
except OSError as exc:
    sys.exit(f"cannot read the engine config {cfg_path}: {exc}")
mapping = (cfg.get("pretrained_config") or {}).get("mapping") or {}
if mapping:
    print(mapping.get("world_size") or mapping.get("tp_size", 1) * mapping.get("pp_size", 1))
else:  # engines built before the unified checkpoint format (TensorRT-LLM < 0.8)
    b = cfg.get("builder_config") or {}
    print(b.get("tensor_parallel", 1) * b.get("pipeline_parallel", 1))
PY
  ) || die "cannot tell the engine's world size; pass --world-size"
fi
require_uint --world-size "$WORLD_SIZE"

if [[ $DRY_RUN == 0 ]]; then
  gpu_count=$(nvidia-smi --list-gpus 2>/dev/null | grep -c '^GPU') || gpu_count=0
  [[ $gpu_count -ge $WORLD_SIZE ]] ||
    die "the engine needs $WORLD_SIZE GPU(s), nvidia-smi lists $gpu_count"
  if [[ $WORLD_SIZE -gt 1 ]]; then
    command -v mpirun >/dev/null 2>&1 || die "mpirun not found: a $WORLD_SIZE-rank engine runs one tritonserver per rank under MPI"
  fi
fi

# --- the command line ---------------------------------------------------------------------------------------------
rank_args() {
  local rank=$1
  RANK_CMD=("$TRITONSERVER" "--model-repository=$MODEL_REPO_DIR")
  if [[ $rank == 0 ]]; then
    RANK_CMD+=("--http-port=$TRITON_HTTP_PORT" "--grpc-port=$TRITON_GRPC_PORT" "--metrics-port=$TRITON_METRICS_PORT")
  else
    # Ranks > 0 are engine workers: no endpoint (rank 0 owns the ports), only the engine model.
    RANK_CMD+=(--allow-http=false --allow-grpc=false --allow-metrics=false --model-control-mode=explicit)
    local name
    IFS=',' read -r -a names <<<"$TRTLLM_MODEL_NAME"
    for name in "${names[@]}"; do
      RANK_CMD+=("--load-model=$name")
    done
  fi
  RANK_CMD+=(--disable-auto-complete-config
    "--backend-config=python,shm-region-prefix-name=prefix${rank}_"
    "--exit-timeout-secs=$TRITON_EXIT_TIMEOUT")
  if [[ ${#EXTRA_ARGS[@]} -gt 0 ]]; then
    RANK_CMD+=("${EXTRA_ARGS[@]}")
  fi
}

if [[ $WORLD_SIZE == 1 ]]; then
  # One GPU needs no MPI: the backend runs in-process, and signals reach tritonserver directly.
  rank_args 0
  CMD=("${RANK_CMD[@]}")
else
  CMD=(mpirun --allow-run-as-root)
  if [[ ${#MPI_ARGS[@]} -gt 0 ]]; then
    CMD+=("${MPI_ARGS[@]}")
  fi
  for ((rank = 0; rank < WORLD_SIZE; rank++)); do
    [[ $rank == 0 ]] || CMD+=(:)
    rank_args "$rank"
    CMD+=(-n 1 "${RANK_CMD[@]}")
  done
fi

echo "+ $(shell_quote "${CMD[@]}")"
if [[ $DRY_RUN == 1 ]]; then
  exit 0
fi

# --- run, wait for readiness, stop cleanly -------------------------------------------------------------------------
READY_URL="http://127.0.0.1:$TRITON_HTTP_PORT/v2/health/ready"

probe_ready() {
  python3 - "$READY_URL" <<'PY'
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=2) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
PY
}

# Every process below $1, children first found by scanning /proc (no procps needed). mpirun starts each
# rank in a process group of its own, so a group signal alone would miss them once mpirun is gone.
descendants() {
  local queue=("$1") found=() parent stat_file stat rest pid ppid
  declare -A children=()
  for stat_file in /proc/[0-9]*/stat; do
    stat=$(<"$stat_file") 2>/dev/null || continue
    pid=${stat%% *}
    rest=${stat##*) }
    read -r _ ppid _ <<<"$rest"
    children[$ppid]+="$pid "
  done
  while [[ ${#queue[@]} -gt 0 ]]; do
    parent=${queue[0]}
    queue=("${queue[@]:1}")
    for pid in ${children[$parent]:-}; do
      found+=("$pid")
      queue+=("$pid")
    done
  done
  echo "${found[*]:-}"
}

SERVER_PID=""
# stop_server REASON EXIT_STATUS
stop_server() {
  local reason=$1 status=$2
  trap - TERM INT
  if [[ -n $SERVER_PID ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    note "$reason: stopping (SIGTERM to process group $SERVER_PID; SIGKILL after ${STOP_TIMEOUT}s)"
    # The negative pid addresses the whole group: mpirun, every rank and the Python-backend stubs.
    kill -TERM -- "-$SERVER_PID" 2>/dev/null || true
    local waited=0
    while kill -0 "$SERVER_PID" 2>/dev/null && [[ $waited -lt $STOP_TIMEOUT ]]; do
      sleep 1
      waited=$((waited + 1))
    done
    if kill -0 "$SERVER_PID" 2>/dev/null; then
      note "still running after ${STOP_TIMEOUT}s: SIGKILL"
      # Collect the ranks before mpirun dies: afterwards they are orphans no longer below it.
      local stragglers
      stragglers=$(descendants "$SERVER_PID")
      kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
      if [[ -n $stragglers ]]; then
        # shellcheck disable=SC2086 # a list of pids, split on purpose
        kill -KILL $stragglers 2>/dev/null || true
      fi
    fi
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  exit "$status"
}
trap 'stop_server SIGTERM 143' TERM
trap 'stop_server SIGINT 130' INT

# Triton's HTTP frontend hands each generate_stream response to the connection's thread through a
# non-blocking socketpair (libevhtp's evthr_defer) and ignores a failed write: a thread behind by more
# than the socket's send buffer holds loses a stream's start, a token or its end. The buffer is
# net.core.wmem_default when Triton creates the socket (at start-up), and the setting is the host's:
# raise it for the start, put it back once Triton is ready.
WMEM_ORIGINAL=""
if [[ $TRITON_HTTP_SEND_BUFFER -gt 0 ]]; then
  wmem=""
  [[ -r $WMEM_DEFAULT_FILE ]] && wmem=$(<"$WMEM_DEFAULT_FILE")
  if ! [[ $wmem =~ ^[0-9]+$ ]]; then
    note "cannot read $WMEM_DEFAULT_FILE: Triton's HTTP frontend may lose generate_stream responses under load"
  elif [[ $wmem -ge $TRITON_HTTP_SEND_BUFFER ]]; then
    :
  elif (echo "$TRITON_HTTP_SEND_BUFFER" >"$WMEM_DEFAULT_FILE") 2>/dev/null; then
    WMEM_ORIGINAL=$wmem
    note "raised net.core.wmem_default from $wmem to $TRITON_HTTP_SEND_BUFFER while tritonserver starts"
  else
    note "net.core.wmem_default is $wmem and cannot be raised here (needs root on the host):" \
      "Triton's HTTP frontend may lose generate_stream responses under load;" \
      "run sysctl -w net.core.wmem_default=$TRITON_HTTP_SEND_BUFFER on the host, or stream over gRPC"
  fi
fi
restore_wmem() {
  if [[ -n $WMEM_ORIGINAL ]]; then
    echo "$WMEM_ORIGINAL" >"$WMEM_DEFAULT_FILE" 2>/dev/null || true
    note "net.core.wmem_default back to $WMEM_ORIGINAL"
    WMEM_ORIGINAL=""
  fi
}
# Whatever ends the script first (with --no-wait, the end of the server) puts it back too.
trap restore_wmem EXIT

# Job control puts the server in its own process group, so stopping it reaches every child.
set -m
"${CMD[@]}" &
SERVER_PID=$!
set +m

if [[ $WAIT_READY == 1 ]]; then
  started=$SECONDS
  until probe_ready; do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      rc=0
      wait "$SERVER_PID" || rc=$?
      die "tritonserver exited with status $rc before it was ready"
    fi
    if [[ $((SECONDS - started)) -ge $READY_TIMEOUT ]]; then
      stop_server "not ready after ${READY_TIMEOUT}s" 1
    fi
    sleep "$READY_POLL_INTERVAL"
  done
  note "ready after $((SECONDS - started))s: http :$TRITON_HTTP_PORT, grpc :$TRITON_GRPC_PORT, metrics :$TRITON_METRICS_PORT ($WORLD_SIZE rank(s))"
  # Ready: its HTTP threads and their sockets exist.
  restore_wmem
fi

rc=0
wait "$SERVER_PID" || rc=$?
# A trapped signal interrupts `wait`; the trap then exits. Reaching here means the server ended by itself.
note "tritonserver exited with status $rc"
exit "$rc"
