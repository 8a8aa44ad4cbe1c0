#!/usr/bin/env bash
# One task of a multi-node t2s training job: task 0 runs the vLLM server, every other task is one training machine.
#
# slurm/train.sbatch starts this once per node (`srun --ntasks-per-node 1`). Without Slurm, start it on every machine
# with the same variables and a rank of its own:
#
#   T2S_RANK=R T2S_HOSTS="host0 host1 host2" bash slurm/node.sh RECIPE [ACCELERATE_CONFIG] [TRAIN FLAGS...]
#
# Inputs (Slurm's own variables, each overridable):
#   T2S_RANK     this task's rank (SLURM_PROCID; two tasks on one host share SLURM_NODEID, so the task's rank is used)
#   T2S_HOSTS    one host per task, in rank order (default: the step's node list and tasks per node)
#   T2S_JOB_DIR  a folder every node sees (shared filesystem): logs, the server weights, and the job's end markers
#                (default: runs/slurm-$SLURM_JOB_ID)
#   SERVER_PORT (8000), MAIN_PORT (29500), GPUS_PER_NODE (the GPUs Slurm gave the node, SLURM_GPUS_ON_NODE, else
#   those CUDA_VISIBLE_DEVICES names, else those nvidia-smi lists; 0 on a CPU machine: one process per machine),
#   T2S_SERVER_WAIT (seconds the trainers wait for the server, 1800)
#
# The trainers start only once the server answers /health. The job ends as a whole: the server's task exits 1 when
# its server dies or a trainer fails, a trainer's exits 1 when the server dies or never answers, and the first
# machine's exit marks the job done or failed for the others (srun --kill-on-bad-exit stops the rest on the first
# failure). Every failure prints one line that starts with "Error:".
set -uo pipefail

RECIPE=${1:?usage: node.sh RECIPE [ACCELERATE_CONFIG] [TRAIN FLAGS...]}
shift
ACCELERATE=multi_gpu
if [ $# -ge 1 ] && [ "${1#-}" = "$1" ]; then  # a second word that is no flag names the accelerate config
    ACCELERATE=$1; shift
fi
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}

RANK=${T2S_RANK:-${SLURM_PROCID:?no T2S_RANK or SLURM_PROCID: start this through slurm/train.sbatch or set T2S_RANK}}
if [ -z "${T2S_HOSTS:-}" ]; then  # the step's hosts, one per task (Slurm's block layout: a node's tasks in a row)
    NODES=$(scontrol show hostnames "${SLURM_STEP_NODELIST:-${SLURM_JOB_NODELIST:?no T2S_HOSTS or SLURM_JOB_NODELIST}}")
    T2S_HOSTS=$("$PY" -c '
import sys
hosts, counts = sys.argv[1].split(), []
for part in sys.argv[2].split(","):  # Slurm writes tasks per node as "2(x3),1"
    count, _, times = part.partition("(x")
    counts += [int(count)] * int(times.rstrip(")") or 1)
print(" ".join(host for host, count in zip(hosts, counts) for _ in range(count)))' \
        "$NODES" "${SLURM_STEP_TASKS_PER_NODE:-${SLURM_TASKS_PER_NODE:-1}}")
fi
read -r -a HOSTS <<< "$T2S_HOSTS"
MACHINES=$(( ${#HOSTS[@]} - 1 ))
JOB_DIR=${T2S_JOB_DIR:-runs/slurm-${SLURM_JOB_ID:-local}}
SERVER_PORT=${SERVER_PORT:-8000}
MAIN_PORT=${MAIN_PORT:-29500}
SERVER_URL="http://${HOSTS[0]}:${SERVER_PORT}"
if [ -z "${GPUS_PER_NODE:-}" ]; then  # nvidia-smi sees every GPU of the node, whatever the job was given
    if [ -n "${SLURM_GPUS_ON_NODE:-}" ]; then
        GPUS_PER_NODE=$SLURM_GPUS_ON_NODE
    elif [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then
        GPUS_PER_NODE=$(tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c .)
    else
        GPUS_PER_NODE=$(nvidia-smi --list-gpus 2>/dev/null | grep -c '^GPU' || true)
    fi
fi
# the other nodes are reached directly, never through a cluster's HTTP proxy
export no_proxy="${no_proxy:+$no_proxy,}$(IFS=,; echo "${HOSTS[*]}"),127.0.0.1,localhost" NO_PROXY
NO_PROXY=$no_proxy
mkdir -p "$JOB_DIR"
# markers older than this file are an earlier job's (a rerun into the same T2S_JOB_DIR); made where the markers are,
# so that both times come from one clock (a shared filesystem's)
STARTED=$(mktemp "$JOB_DIR/.started.XXXXXX")
trap 'rm -f "$STARTED"' EXIT
fail() { echo "Error: $*" >&2; exit 1; }
marked() { [ -f "$JOB_DIR/$1" ] && [ "$JOB_DIR/$1" -nt "$STARTED" ]; }
[ "$MACHINES" -ge 1 ] || fail "a job needs at least 2 tasks: one for the vLLM server and one per training machine"
[ -f "recipes/$RECIPE.yaml" ] || fail "no recipe recipes/$RECIPE.yaml"
[ -f "accelerate_configs/$ACCELERATE.yaml" ] || fail "no accelerate config accelerate_configs/$ACCELERATE.yaml"

if [ "$RANK" -eq 0 ]; then
    # ---------------------------------------------------------------- the vLLM server (make serve)
    MODEL=$("$PY" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["model_name_or_path"])' \
        "recipes/$RECIPE.yaml") || fail "recipes/$RECIPE.yaml names no model_name_or_path"
    for flag in "$@"; do  # a --model_name_or_path among the train flags is the model served too
        [ "${take:-}" = 1 ] && MODEL=$flag && take=0
        [ "$flag" = --model_name_or_path ] && take=1
        case $flag in --model_name_or_path=*) MODEL=${flag#*=} ;; esac
    done
    rm -f "$JOB_DIR/done" "$JOB_DIR/failed" "$JOB_DIR/server-died"  # an earlier job's markers
    LOG="$JOB_DIR/server.log"
    setsid make --no-print-directory -o install-vllm serve MODEL="$MODEL" HOST=0.0.0.0 PORT="$SERVER_PORT" \
        SERVE_ARGS="${SERVE_ARGS:-}" > "$LOG" 2>&1 &
    SERVER=$!
    # the server's process group; or the process itself, when this task ends before setsid has made the group
    trap 'kill -- -$SERVER 2>/dev/null || kill $SERVER 2>/dev/null; rm -f "$STARTED"' EXIT
    echo "t2s: the vLLM server for $MODEL starts on ${HOSTS[0]}:$SERVER_PORT (log: $LOG)"
    while :; do
        marked done && exit 0
        marked failed && fail "a training machine failed ($(cat "$JOB_DIR/failed")); the server stops"
        kill -0 "$SERVER" 2>/dev/null || { touch "$JOB_DIR/server-died"; fail "the vLLM server on ${HOSTS[0]} exited; see $LOG"; }
        sleep 0.5  # two file tests and kill -0 a round: the job ends within half a second of its trainers
    done
fi

# -------------------------------------------------------------------- one training machine
MACHINE=$(( RANK - 1 ))
WAIT=${T2S_SERVER_WAIT:-1800}
DEADLINE=$(( SECONDS + WAIT ))
while :; do
    "$PY" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/health", timeout=2)' \
        "$SERVER_URL" 2>/dev/null && break
    marked server-died && fail "the vLLM server on ${HOSTS[0]} exited before it answered"
    [ "$SECONDS" -ge "$DEADLINE" ] && fail "the vLLM server at $SERVER_URL did not answer /health within $WAIT s"
    sleep 2
done
if [ "$GPUS_PER_NODE" -gt 0 ]; then
    PROCESSES=$(( MACHINES * GPUS_PER_NODE )); DEVICE=()
else  # a CPU machine: one process, gloo, and no mixed precision (the GPU configs ask for bf16)
    PROCESSES=$MACHINES; DEVICE=(--mixed_precision no)
fi
echo "t2s: machine $MACHINE of $MACHINES (${HOSTS[$RANK]}), $PROCESSES processes in all, main ${HOSTS[1]}:$MAIN_PORT, server $SERVER_URL"
# accelerate launch, through t2s.training.launch: a training process that fails ends it with its own exit code, and
# without the launcher's traceback
"$PY" -m t2s.training.launch --config_file "accelerate_configs/$ACCELERATE.yaml" "${DEVICE[@]}" \
    --num_machines "$MACHINES" --machine_rank "$MACHINE" --num_processes "$PROCESSES" \
    --main_process_ip "${HOSTS[1]}" --main_process_port "$MAIN_PORT" --rdzv_backend static \
    -m t2s train --config "recipes/$RECIPE.yaml" --rollout_backend vllm_server --vllm_server_base_url "$SERVER_URL" "$@"
rc=$?
if [ "$rc" -ne 0 ]; then
    echo "machine $MACHINE exited $rc" > "$JOB_DIR/failed"
    if [ "$rc" -eq 2 ]; then  # t2s train's exit after its own Error: line (recipe, config, data or model): no second
        echo "t2s: training on machine $MACHINE (${HOSTS[$RANK]}) exited $rc; the job stops" >&2
        exit 1
    fi
    fail "training on machine $MACHINE (${HOSTS[$RANK]}) exited $rc"
fi
[ "$MACHINE" -eq 0 ] && touch "$JOB_DIR/done"
exit 0
