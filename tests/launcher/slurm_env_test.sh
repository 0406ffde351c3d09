#!/usr/bin/env bash
# dtrain train in Slurm's environments, without Slurm (the variables are what matters):
# a task of a 4-task srun step whose MPI was not started through Slurm's PMI (Open MPI then runs
# it as a one-rank singleton) fails with one clear line and a non-zero status; a lone dtrain train
# in an sbatch batch script (the allocation's variables, no job step) trains as one process.
#   slurm_env_test.sh DTRAIN
set -uo pipefail

dtrain=${1:?usage: slurm_env_test.sh DTRAIN}
readonly DATA=/usr/share/datasets/fashion-mnist
[ -e "$DATA/train-images-idx3-ubyte.gz" ] || { echo "SKIPPED: $DATA is missing"; exit 77; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
train=("$dtrain" train --epochs 1 --train-limit 256 --test-limit 100)
allocation=(SLURM_JOB_ID=77 SLURM_JOB_NODELIST=node1 SLURM_NTASKS=4 SLURM_TASKS_PER_NODE=4 SLURM_NNODES=1)
failures=0
check() { local name=$1; shift; if "$@"; then echo "ok - $name"; else echo "not ok - $name"; failures=$((failures + 1)); fi; }

status=0
out=$(env "${allocation[@]}" SLURM_STEP_ID=0 SLURM_STEPID=0 SLURM_STEP_NUM_TASKS=4 SLURM_PROCID=2 "${train[@]}" 2>&1) || status=$?
printf '# srun step without PMI: exit %s\n%s\n' "$status" "$(printf '%s\n' "$out" | sed 's/^/#   /')"
check "srun without PMI: non-zero exit" [ "$status" != 0 ]
check "srun without PMI: one line naming the task count and the world size" \
  [ "$(printf '%s\n' "$out" | grep -c 'this is task 2 of the 4 that the launcher started (SLURM_STEP_NUM_TASKS=4), but MPI sees a world of 1 rank')" = 1 ]
check "srun without PMI: nothing else printed" [ "$(printf '%s\n' "$out" | grep -c .)" = 1 ]

status=0
out=$(env "${allocation[@]}" SLURM_PROCID=0 "${train[@]}" 2>&1) || status=$?
printf '# lone dtrain train in a batch script: exit %s\n' "$status"
check "sbatch batch step: trains as one process" [ "$status" = 0 ]
check "sbatch batch step: on 1 rank" grep -q 'on 1 rank(s)' <<<"$out"
exit $((failures > 0))
