#!/usr/bin/env bash
# NumPy data end to end: arrays that numpy (Debian's python3-numpy) writes from the Fashion-MNIST
# IDX files train the same model, to the bit, as the IDX files themselves, at NP ranks (the
# distributed sampler) for the MLP and the CNN: {train,test}_{x,y}.npy of uint8 [N, 1, 28, 28]
# and int64 labels, {train,test}.npz (np.savez stored, np.savez_compressed deflated) of uint8
# [N, 28, 28] and uint8 labels, and float32 x / 255 with int32 labels. Then a resume from a
# checkpoint of a NumPy run ends bitwise where the uninterrupted run ends, `dtrain eval` reads
# the NumPy test split, and malformed files are one line and exit status 65 (bad data).
#   npy_data_test.sh PATH/TO/dtrain NP
set -uo pipefail
DTRAIN=${1:?usage: npy_data_test.sh PATH/TO/dtrain NP}
NP=${2:?usage: npy_data_test.sh PATH/TO/dtrain NP}
# shellcheck source=lib.sh
source "$(dirname "$0")/lib.sh"

if ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  echo "SKIPPED: /usr/bin/python3 cannot import numpy (apt-get install python3-numpy)"
  exit 77
fi

readonly TRAIN=$((400 * NP)) TEST=300
# The first TRAIN training and TEST test samples of the IDX files, as numpy arrays in four folders.
/usr/bin/python3 - "$DATA" "$WORK" "$TRAIN" "$TEST" <<'EOF' || { echo "not ok - writing the arrays"; exit 1; }
import gzip, os, sys
import numpy as np
src, work, n_train, n_test = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

def idx(stem):
    path = os.path.join(src, stem)
    data = gzip.open(path + ".gz").read() if os.path.exists(path + ".gz") else open(path, "rb").read()
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(data[3])]
    return np.frombuffer(data, np.uint8, offset=4 + 4 * len(dims)).reshape(dims)

for name in ("npy", "npz", "float", "bad"):
    os.makedirs(os.path.join(work, name), exist_ok=True)
for split, prefix, n in (("train", "train", n_train), ("test", "t10k", n_test)):
    x, y = idx(prefix + "-images-idx3-ubyte")[:n], idx(prefix + "-labels-idx1-ubyte")[:n]
    np.save(os.path.join(work, "npy", split + "_x.npy"), x[:, None])
    np.save(os.path.join(work, "npy", split + "_y.npy"), y.astype(np.int64))
    save = np.savez if split == "train" else np.savez_compressed
    save(os.path.join(work, "npz", split + ".npz"), x=x, y=y)
    np.save(os.path.join(work, "float", split + "_x.npy"), x.astype(np.float32) / np.float32(255))
    np.save(os.path.join(work, "float", split + "_y.npy"), y.astype(np.int32))
EOF


for model in mlp cnn; do
  args=(train --threads 1 --test-limit "$TEST" --log-interval 10 --model "$model" --batch-size 32 --epochs 2 --json)
  if ! dtrain_at "$NP" "$WORK/idx-$model.log" "${args[@]}" --data "$DATA" --train-limit "$TRAIN"; then
    not_ok "$model on the IDX files" "$(tail -3 "$WORK/idx-$model.log")"
    continue
  fi
  want=$(fingerprint "$WORK/idx-$model.log")
  for form in npy npz float; do
    if ! dtrain_at "$NP" "$WORK/$form-$model.log" "${args[@]}" --data "$WORK/$form"; then
      not_ok "$model on $form arrays" "$(tail -3 "$WORK/$form-$model.log")"
      continue
    fi
    got=$(fingerprint "$WORK/$form-$model.log")
    check "$model at np $NP: $form arrays train the weights the IDX files train ($got = $want)" \
      [ -n "$want" -a "$got" = "$want" ]
    check "$model: $form arrays, the same log lines as the IDX files" \
      diff <(grep -E '^(Train Epoch|Test set)' "$WORK/idx-$model.log") <(grep -E '^(Train Epoch|Test set)' "$WORK/$form-$model.log")
  done
done

# The pipeline trainer reads NumPy arrays as the data-parallel one does (it read IDX files
# whatever --data held, and named a missing train-images-idx3-ubyte.gz).
if [ $((NP % 2)) = 0 ]; then
  pipe_args=(train --threads 1 --test-limit "$TEST" --log-interval 10 --model mlp --batch-size 32 --epochs 1
    --pipeline-stages 2)
  if dtrain_at "$NP" "$WORK/idx-pipe.log" "${pipe_args[@]}" --data "$DATA" --train-limit "$TRAIN" &&
    dtrain_at "$NP" "$WORK/npz-pipe.log" "${pipe_args[@]}" --data "$WORK/npz"; then
    check "--pipeline-stages 2 on npz arrays: the log lines of the IDX files" \
      diff <(grep -E '^(Train Epoch|Test set)' "$WORK/idx-pipe.log") <(grep -E '^(Train Epoch|Test set)' "$WORK/npz-pipe.log")
  else
    not_ok "--pipeline-stages 2 on NumPy data" "$(tail -3 "$WORK/idx-pipe.log" "$WORK/npz-pipe.log")"
  fi
fi

# Resuming a NumPy run from its checkpoint at step 20 ends where the run that did not stop ends.
ck_args=(train --threads 1 --model cnn --batch-size 32 --epochs 2 --data "$WORK/npz" --log-interval 10)
if dtrain_at "$NP" "$WORK/ref.log" "${ck_args[@]}" --checkpoint-dir "$WORK/ref" --checkpoint-every 10 --keep 100 &&
  dtrain_at "$NP" "$WORK/resumed.log" "${ck_args[@]}" --checkpoint-dir "$WORK/resumed" --resume "$WORK/ref/step-20"; then
  check "resume from a NumPy run's step-20: final model.safetensors bitwise identical" \
    cmp "$(final_model "$WORK/ref")" "$(final_model "$WORK/resumed")"
  if dtrain_at "$NP" "$WORK/eval.log" eval --threads 1 --weights "$(final_model "$WORK/ref")" --data "$WORK/npz"; then
    check "dtrain eval on the NumPy test split: the training run's last test line" \
      [ "$(grep '^Test set' "$WORK/eval.log")" = "$(grep '^Test set' "$WORK/ref.log" | tail -1)" ]
  else
    not_ok "dtrain eval on NumPy data" "$(tail -3 "$WORK/eval.log")"
  fi
  # A folder holding the test split alone is eval's data too, as with IDX files.
  mkdir -p "$WORK/test-only" && cp "$WORK/npz/test.npz" "$WORK/test-only/"
  if dtrain_at "$NP" "$WORK/eval-test-only.log" eval --threads 1 --weights "$(final_model "$WORK/ref")" \
    --data "$WORK/test-only"; then
    check "dtrain eval on a folder of the test split alone: the same test line" \
      [ "$(grep '^Test set' "$WORK/eval-test-only.log")" = "$(grep '^Test set' "$WORK/eval.log")" ]
  else
    not_ok "dtrain eval on a folder of the NumPy test split alone" "$(tail -3 "$WORK/eval-test-only.log")"
  fi
else
  not_ok "checkpoint and resume on NumPy data" "$(tail -3 "$WORK/ref.log" "$WORK/resumed.log" 2>/dev/null)"
fi

# expect_bad NAME FIELD: training on $WORK/bad exits 65 with one line naming the file and FIELD.
expect_bad() {
  local name=$1 field=$2 status
  dtrain_at "$NP" "$WORK/bad.log" train --threads 1 --data "$WORK/bad"
  status=$?
  local line
  line=$(grep -m1 '^dtrain: ' "$WORK/bad.log")
  echo "#   $name: exit $status: $line"
  check "$name: exit status 65 (got $status)" [ "$status" = 65 ]
  check "$name: one line naming the file and the field" grep -q "$WORK/bad/.*$field" <<<"$line"
}
cp "$WORK/npy/"*.npy "$WORK/bad/"
printf 'XY' | dd of="$WORK/bad/test_x.npy" bs=1 seek=1 conv=notrunc status=none
expect_bad "bad magic" "test_x.npy: not a .npy file (bad magic"
cp "$WORK/npy/test_x.npy" "$WORK/bad/"
truncate -s -7 "$WORK/bad/train_x.npy"
expect_bad "a truncated x" "train_x.npy: header field 'shape'"
cp "$WORK/npy/train_x.npy" "$WORK/bad/"
/usr/bin/python3 -c "import numpy as np, sys; np.save(sys.argv[1], np.array([None] * 3, dtype=object))" "$WORK/bad/train_y.npy"
expect_bad "an object array" "train_y.npy: header field 'descr' is '|O'"
/usr/bin/python3 -c "import numpy as np, sys; np.save(sys.argv[1], np.arange($TRAIN) - 1)" "$WORK/bad/train_y.npy"
expect_bad "a negative label" "train_y.npy: label -1 of sample 0 is out of range"
finish
