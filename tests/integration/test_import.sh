#!/bin/sh
# test_import.sh - qlinearctl import against a real qlineard on a temporary
# socket: a float checkpoint written here (one file, and sharded with its
# index) is quantized by the daemon and served; GPTQ and AWQ checkpoints
# packed by their own packers (tests/data/ckpt) are converted and served,
# their results checked against the packers' dequantization; malformed
# files and unsupported checkpoints are refused with errors naming the
# problem.
set -u
: "${QLINEARD:?run through make check}" "${QLINEARCTL:?}" "${QL_SRCDIR:?}"

dir=$(mktemp -d /tmp/ql-import-XXXXXX)
work="$dir/work"
mkdir -p "$work"
chmod 700 "$dir"
pass=0
fail=0
daemon=""
data="$QL_SRCDIR/tests/data/ckpt"
py="python3 $QL_SRCDIR/tests/integration/import_data.py"

cleanup() {
  if [ -n "$daemon" ]; then kill "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null; fi
  rm -rf "$dir"
}
trap cleanup EXIT

ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }

# expect STATUS DESCRIPTION -- COMMAND...: runs COMMAND, checks its exit status.
expect() {
  want=$1; what=$2; shift 3
  "$@" >"$dir/out" 2>"$dir/err"
  got=$?
  if [ "$got" -eq "$want" ]; then ok; else
    bad "$what: exit $got, want $want"; cat "$dir/out" "$dir/err"; fi
}
# has FILE TEXT DESCRIPTION: FILE contains TEXT.
has() {
  grep -q -- "$2" "$1" && ok || { bad "$3: no '$2' in: $(cat "$1")"; }
}

"$QLINEARD" --socket-dir "$dir/sock" --state-dir "$dir/state" --log-level debug 2>"$dir/daemon.log" &
daemon=$!
export QLINEAR_ADDRESS="ipc://$dir/sock/qlineard.sock"
i=0
# admin.sock is bound after the request and session sockets
until [ -S "$dir/sock/qlineard.sock" ] && [ -S "$dir/sock/admin/admin.sock" ]; do
  i=$((i + 1)); [ $i -lt 200 ] || { echo "daemon did not start"; cat "$dir/daemon.log"; exit 1; }
  sleep 0.05
done
ctl="$QLINEARCTL"

# ---- a float checkpoint written by this test
expect 0 "write the float checkpoint" -- $py float "$work"
expect 0 "dry run" -- "$ctl" import "$work/model.safetensors" --dry-run --prefix f/
has "$dir/out" "f/layers.0.proj .*F32 .*64x128 .*q4g128 .*yes" "dry run lists proj"
has "$dir/out" "f/layers.1.up .*F16 .*32x64" "dry run lists up"
has "$dir/out" "would import 2 tensors" "dry run summary"
expect 1 "persist on the request socket" -- "$ctl" import "$work/model.safetensors" --persist
has "$dir/err" "admin socket" "persist needs the admin socket"
expect 0 "import" -- "$ctl" --admin import "$work/model.safetensors" --prefix f/ --format q4g128 --persist
has "$dir/out" "imported 2 of 2 tensors" "import summary"
has "$dir/out" "cpu: .* resident" "import summary per device"
expect 0 "list" -- "$ctl" list
has "$dir/out" "f/layers.0.proj" "list shows the imported weight"
ls "$dir/state"/*.safetensors >/dev/null 2>&1 && ok || bad "--persist stored nothing"
# The import uploaded exactly the float weight and bias of the file: the
# same data loaded from .npy has the same digest and is shared.
expect 0 "load the same weight from .npy" -- "$ctl" load f/layers.0.proj "$work/w0.npy" --format q4g128 --bias "$work/b0.npy"
has "$dir/out" "shared" "npy load of the imported weight is shared"
expect 0 "linear on the imported weight" -- "$ctl" linear f/layers.0.proj "$work/x0.npy" -o "$work/y0.npy"
grep -q "'shape': (3, 64)" "$work/y0.npy" && ok || bad "y0 is not (3, 64)"
expect 0 "linear on the f16 weight" -- "$ctl" linear f/layers.1.up "$work/x1.npy"
# The sharded form through its index, one layer selected by --match.
expect 0 "sharded import" -- "$ctl" --admin import "$work/sharded/model.safetensors.index.json" --prefix s/ --match 'proj$' --devices cpu
has "$dir/out" "imported 1 of 1 tensors .* from 2 file" "sharded summary"
expect 0 "sharded weight equals the single file's" -- "$ctl" load s/layers.0.proj "$work/w0.npy" --format q4g128 --bias "$work/b0.npy"
has "$dir/out" "shared" "sharded import is the same weight"
# --scale-dtype: the scales are rounded to and kept in that dtype, as load
# keeps them; the default's weight (f32 scales) is another one.
expect 0 "import with bf16 scales" -- "$ctl" --admin import "$work/model.safetensors" --prefix e/ --match 'proj$' --format q8c --scale-dtype bf16
expect 1 "the default's scales are other content" -- "$ctl" load e/layers.0.proj "$work/w0.npy" --format q8c --bias "$work/b0.npy"
has "$dir/err" "other content" "load with other scales refused"
expect 0 "the same scale dtype is the same weight" -- "$ctl" load e/layers.0.proj "$work/w0.npy" --format q8c --bias "$work/b0.npy" --scale-dtype bf16
has "$dir/out" "shared" "import --scale-dtype and load --scale-dtype share"
expect 2 "bad scale dtype" -- "$ctl" import "$work/model.safetensors" --scale-dtype f64 --dry-run
has "$dir/err" "scale-dtype" "bad scale dtype named"
expect 1 "unknown device" -- "$ctl" --admin import "$work/model.safetensors" --prefix d/ --devices cuda:7
has "$dir/err" "no device 'cuda:7'" "unknown device named"
expect 1 "nothing matches" -- "$ctl" import "$work/model.safetensors" --match 'nope' --dry-run
has "$dir/err" "no layer to import" "empty match"

# ---- GPTQ and AWQ checkpoints packed by their packers
for c in gptq4_asym_g64:128 gptq8_asym_g64:128 gptq4_sym_g128:256 awq4_g64:128 gptq4_asym_g32_v2:128; do
  name=${c%%:*}; k=${c##*:}
  expect 0 "import $name" -- "$ctl" --admin import "$data/$name/model.safetensors" --prefix "q/$name/"
  has "$dir/out" "imported 1 of 1" "$name summary"
  expect 0 "x for $name" -- $py x "$k" 3 "$work/x_$name.npy"
  expect 0 "linear $name" -- "$ctl" linear "q/$name/model.layers.0.mlp.down_proj" "$work/x_$name.npy" -o "$work/y_$name.npy" --path wo
  expect 0 "$name against the packer's dequantization" -- $py check "$data/$name/ref.safetensors" "$data/$name/model.safetensors" "$work/x_$name.npy" "$work/y_$name.npy"
done
# TorchAO subclasses as TorchAO's serializer saves them (tests/data/torchao),
# against TorchAO's dequantization (tests/data/golden).
for c in q4g_g128_bf16 q4g_g32_bf16 q4i_g128_f16 q8c_bf16 f8r_f32; do
  f="$QL_SRCDIR/tests/data/torchao/$c.safetensors"
  expect 0 "import TorchAO $c" -- "$ctl" --admin import "$f" --prefix "t/$c/"
  has "$dir/out" "imported 1 of 1" "TorchAO $c summary"
  expect 0 "x for $c" -- $py x 256 3 "$work/x_$c.npy"
  expect 0 "linear TorchAO $c" -- "$ctl" linear "t/$c/model.layers.0.self_attn.o_proj" "$work/x_$c.npy" -o "$work/y_$c.npy" --path wo
  expect 0 "TorchAO $c against TorchAO's dequantization" -- $py check "$QL_SRCDIR/tests/data/golden/$c/w_deq.npy" "$f" "$work/x_$c.npy" "$work/y_$c.npy"
done
expect 1 "act-order refused" -- "$ctl" --admin import "$data/gptq4_actorder/model.safetensors"
has "$dir/err" "model.layers.0.mlp.down_proj.g_idx: act-order" "act-order error names g_idx"
# The float weights of a quantized checkpoint come along only with --format.
expect 0 "write a GPTQ checkpoint with a float lm_head" -- $py mixed "$data/gptq8_sym_g128" "$work/mixed"
expect 0 "mixed, dry run" -- "$ctl" import "$work/mixed/model.safetensors" --dry-run
has "$dir/out" "down_proj .*gptq 8-bit g128 sym .*q8b128 " "GPTQ layer listed"
has "$dir/out" "1 float weights of this quantized checkpoint skipped" "float weight skipped"
expect 0 "mixed with --format" -- "$ctl" --admin import "$work/mixed/model.safetensors" --format q8c --prefix m/
has "$dir/out" "imported 2 of 2" "mixed import"
expect 0 "list the mixed import" -- "$ctl" list
has "$dir/out" "m/lm_head .*q8c" "lm_head quantized to --format"
has "$dir/out" "m/model.layers.0.mlp.down_proj .*q8b128" "GPTQ layer keeps its format"

# Each GPTQ layer is converted just before its upload: the import's heap
# stays near one layer's, not the model's (54 MiB converted here; it held
# all of it before the first upload).
expect 0 "write a 24-layer GPTQ checkpoint" -- $py big "$work/big" 24 2048 2048
expect 0 "import it" -- $py peakanon "$work/big/peak" "$ctl" --admin import "$work/big/model.safetensors" --prefix big/
has "$dir/out" "imported 24 of 24" "24-layer import"
peak=$(cat "$work/big/peak" 2>/dev/null || echo 0)
[ "$peak" -gt 0 ] && [ "$peak" -lt 27648 ] && ok || bad "import heap peaked at $peak KiB (a layer is 2.2 MiB, the model 54 MiB)"
rm -f "$work/big/model.safetensors"

# ---- malformed files
expect 0 "write the malformed files" -- $py bad "$work/bad"
expect 1 "truncated" -- "$ctl" import "$work/bad/truncated.safetensors"
has "$dir/err" "a.weight': data_offsets .* outside" "truncated file"
expect 1 "overlap" -- "$ctl" import "$work/bad/overlap.safetensors"
has "$dir/err" "overlap" "overlapping offsets"
expect 1 "wrong dtype" -- "$ctl" import "$work/bad/dtype.safetensors"
has "$dir/err" "unknown dtype 'F4'" "wrong dtype"
expect 1 "header larger than the file" -- "$ctl" import "$work/bad/hugeheader.safetensors"
has "$dir/err" "header of 1048576 bytes is larger than" "huge header"
expect 1 "unknown quantization" -- "$ctl" import "$work/bad/unknown.safetensors" --dry-run
has "$dir/err" "l.weight_packed: .*no recognised layout" "unknown quantization named"
expect 1 "missing file" -- "$ctl" import "$work/nope.safetensors"
has "$dir/err" "cannot open" "missing file"
# Indexes that do not describe their shards: none named (it crashed), a
# tensor its shard does not hold (half the model imported as success).
mkdir -p "$work/idx"
cp "$work/sharded/"*.safetensors "$work/idx/"
echo '{"weight_map": {}}' >"$work/idx/empty.safetensors.index.json"
expect 1 "index naming no tensor" -- "$ctl" import "$work/idx/empty.safetensors.index.json" --dry-run
has "$dir/err" "names no tensor" "empty index"
sed 's/"weight_map": {/"weight_map": {"layers.9.proj.weight": "model-00001-of-00002.safetensors", /' \
  "$work/sharded/model.safetensors.index.json" >"$work/idx/more.safetensors.index.json"
grep -q 'layers.9.proj' "$work/idx/more.safetensors.index.json" || bad "the test's index edit did nothing"
expect 1 "index naming a tensor its shard lacks" -- "$ctl" import "$work/idx/more.safetensors.index.json" --dry-run
has "$dir/err" "layers.9.proj.weight' is not in its shard" "missing tensor named"
# FIFOs where files are read (an archive can hold them): refused, or
# passed over for config.json, at once rather than waiting for a writer.
mkdir -p "$work/fifo"
cp "$work/model.safetensors" "$work/fifo/"
mkfifo "$work/fifo/config.json" "$work/fifo/pipe.safetensors"
expect 0 "config.json a FIFO" -- timeout 20 "$ctl" import "$work/fifo/model.safetensors" --dry-run
has "$dir/out" "would import 2 tensors" "import beside a FIFO"
expect 1 "a FIFO as the checkpoint" -- timeout 20 "$ctl" import "$work/fifo/pipe.safetensors" --dry-run
has "$dir/err" "not a regular file" "FIFO checkpoint refused"

# The daemon survived all of it and stops cleanly.
kill -TERM "$daemon"
wait "$daemon"
st=$?
daemon=""
[ "$st" -eq 0 ] && ok || bad "qlineard exited $st on SIGTERM"
if [ "$fail" -ne 0 ]; then
  echo "---- daemon log"; tail -30 "$dir/daemon.log"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
