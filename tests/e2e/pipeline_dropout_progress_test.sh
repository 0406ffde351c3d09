#!/usr/bin/env bash
# --pipeline-stages with --dropout and --progress on (issue 23 item 4), at NP 2 (P 2), NP 3 (P 3)
# and NP 4 (P 2 x D 2):
# - --dropout 0.3 (Note [Pipeline dropout] in pipeline/pipeline_stage.h): each stage draws the
#   masks the unsplit model draws for the same rows, so the log lines (losses within 1e-5) and the
#   weights (1e-5 relative) are those of the unsplit model with --dropout trained data-parallel on
#   D ranks with the same per-replica batch (one process at D 1; at D 2 each replica draws as a
#   data-parallel rank does, not as one process on the global batch, and only the test set lines
#   are compared: the data-parallel run logs rank 0's loss); state.json's
#   dropout_counters are that run's (the stages' counters gathered in the unsplit model's order),
#   and a data-parallel run resumed from its first epoch's checkpoint ends with the unsplit weights;
#   the pipeline resumed from it at the same P x D ends bit for bit as the uninterrupted run (model
#   and state.json), and from the data-parallel run's checkpoint within 1e-5 of that run;
#   GPipe ends with 1F1B's weights bit for bit; and dropout matters (the run without it logs other
#   losses);
# - --progress on: the image models' and the GPT's progress line, redrawn in place by one rank
#   (the last stage's replica 0) instead of the step lines, with the test set / val lines below.
# Usage: pipeline_dropout_progress_test.sh DTRAIN NP
set -uo pipefail
DTRAIN=$1
NP=${2:-2}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

pipeline_layout "$NP"
RUN=("${COMMON[@]}" --train-limit 1536 --hidden 64,48,32 --epochs 2 --batch-size "$B")
PIPE=(--pipeline-stages "$P" --micro-batches "$M")
counters() {
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["rng"]["dropout_counters"])' \
    "$(dirname "$(final_model "$1")")/state.json"
}

dtrain_at "$D" "$WORK/ref.log" train "${RUN[@]}" --dropout 0.3 --checkpoint-dir "$WORK/ref"
dtrain_at "$NP" "$WORK/pipe.log" train "${RUN[@]}" "${PIPE[@]}" --dropout 0.3 --checkpoint-dir "$WORK/pipe"
check "--dropout: P $P x D $D exits 0" grep -q '^Test set' "$WORK/pipe.log"
if [ "$D" = 1 ]; then
  check "--dropout: P $P x D $D logs the unsplit dropout run's losses and test set" \
    same_lines "$WORK/ref.log" "$WORK/pipe.log"
else  # a data-parallel run logs rank 0's loss, a pipeline the mean over its replicas: the test sets
  grep '^Test set' "$WORK/ref.log" >"$WORK/ref_test.log"
  grep '^Test set' "$WORK/pipe.log" >"$WORK/pipe_test.log"
  check "--dropout: P $P x D $D logs the unsplit dropout run's test set" \
    same_lines "$WORK/ref_test.log" "$WORK/pipe_test.log"
fi
final_weights_close "$WORK/ref" "$WORK/pipe" 1e-5
check "--dropout: weights within 1e-5 of the unsplit dropout run's" [ $? -eq 0 ]
# GPipe recomputes on every stage (the last included: Note [Recomputed activations]), with the
# counters each micro-batch's first forward used.
dtrain_at "$NP" "$WORK/gpipe.log" train "${RUN[@]}" "${PIPE[@]}" --pipeline-schedule gpipe --dropout 0.3 \
  --checkpoint-dir "$WORK/gpipe"
check "--dropout: GPipe's weights are 1F1B's bit for bit" cmp "$(final_model "$WORK/pipe")" "$(final_model "$WORK/gpipe")"
ref_counters=$(counters "$WORK/ref") pipe_counters=$(counters "$WORK/pipe")
echo "# dropout_counters: $ref_counters / $pipe_counters"
check "--dropout: state.json's dropout_counters are the unsplit run's (3 layers)" \
  same_nonempty "$pipe_counters" "$ref_counters"
# The pipeline's first epoch-end checkpoint resumed without the pipeline (D ranks): the gathered
# counters go on drawing the unsplit run's masks.
first=$(ls -d "$WORK"/pipe/step-* | sort -V | head -1)
dtrain_at "$D" "$WORK/res.log" train "${RUN[@]}" --dropout 0.3 --resume "$first" --checkpoint-dir "$WORK/res"
final_weights_close "$WORK/ref" "$WORK/res" 1e-5
check "--dropout: the pipeline's checkpoint resumed on $D rank(s) ends within 1e-5 of the unsplit run" [ $? -eq 0 ]
# The same checkpoint resumed by the pipeline at its own P x D: each stage takes its Dropout
# layers' counters back from the whole model's list, so the run ends as the uninterrupted one,
# bit for bit (model and state.json).
dtrain_at "$NP" "$WORK/pres.log" train "${RUN[@]}" "${PIPE[@]}" --dropout 0.3 --resume "$first" \
  --checkpoint-dir "$WORK/pres"
check "--dropout: the pipeline resumed at P $P x D $D ends with the uninterrupted run's weights bit for bit" \
  cmp "$(final_model "$WORK/pipe")" "$(final_model "$WORK/pres")"
check "--dropout: the pipeline resumed at P $P x D $D ends with the uninterrupted run's state.json" \
  cmp "$(dirname "$(final_model "$WORK/pipe")")/state.json" "$(dirname "$(final_model "$WORK/pres")")/state.json"
# A data-parallel run's first epoch-end checkpoint resumed by the pipeline: the stages take the
# unsplit model's counters at their layers' places and end as the uninterrupted data-parallel run.
rfirst=$(ls -d "$WORK"/ref/step-* | sort -V | head -1)
dtrain_at "$NP" "$WORK/dres.log" train "${RUN[@]}" "${PIPE[@]}" --dropout 0.3 --resume "$rfirst" \
  --checkpoint-dir "$WORK/dres"
final_weights_close "$WORK/ref" "$WORK/dres" 1e-5
check "--dropout: a data-parallel checkpoint resumed at P $P x D $D ends within 1e-5 of the data-parallel run" \
  [ $? -eq 0 ]
# (The weights cannot be compared: the Dropout layers shift the layers' names.)
dtrain_at "$D" "$WORK/plain.log" train "${RUN[@]}"
! same_lines "$WORK/ref.log" "$WORK/plain.log" >/dev/null 2>&1
check "--dropout 0.3 matters (the unsplit run logs other losses than the run without it)" [ $? -eq 0 ]

dtrain_at "$NP" "$WORK/progress.log" train "${RUN[@]}" "${PIPE[@]}" --epochs 1 --progress on
check "--progress on: exit 0 (status $?)" grep -q '^Test set' "$WORK/progress.log"
check "--progress on: redrawn in place (carriage returns)" grep -q $'\r' "$WORK/progress.log"
check "--progress on: one rank draws the epoch's last line" \
  [ "$(grep -Eo $'\repoch 1/1 100% \\[#+\\] [0-9]+/[0-9]+  [0-9]+ samples/s  loss [0-9.]+  ETA 0:00' \
    "$WORK/progress.log" | wc -l)" = 1 ]
check "--progress on: no step log lines" bash -c "! grep -q 'Train Epoch' '$WORK/progress.log'"

TEXT=/usr/lib/python3.11/json
if [ ! -d "$TEXT" ]; then
  echo "# SKIPPED the GPT's progress line: $TEXT not found (Python 3.11's standard library)"
elif ! "$DTRAIN" data shard --bytes "$TEXT" -o "$WORK/shards" >"$WORK/shard.log" 2>&1; then
  not_ok "byte shards of $TEXT" "$(tail -3 "$WORK/shard.log")"
else
  dtrain_at "$NP" "$WORK/gpt.log" train --model gpt --layers 2 --heads 2 --embd 32 --context 32 --data "$WORK/shards" \
    --steps 10 --eval-every 5 --eval-batches 2 --threads 1 --batch-size 12 "${PIPE[@]}" --progress on
  check "--model gpt --progress on: exit 0 (status $?)" grep -q '^val loss' "$WORK/gpt.log"
  check "--model gpt --progress on: one rank draws the last step's line" \
    [ "$(grep -Eo $'\rstep 10/10 100% \\[#+\\]  [0-9]+ tokens/s  loss [0-9.]+  lr [0-9.]+e-0[0-9]  ETA 0:00' \
      "$WORK/gpt.log" | wc -l)" = 1 ]
  check "--model gpt --progress on: no per-step log lines" bash -c "! grep -q '^step [0-9]*/10 |' '$WORK/gpt.log'"
  check "--model gpt --progress on: the val loss lines, each on its own line (2)" \
    [ "$(grep -c '^val loss [0-9.]*$' "$WORK/gpt.log")" = 2 ]
fi
finish
