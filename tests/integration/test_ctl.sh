#!/bin/sh
# test_ctl.sh - the README's qlinearctl lines, as pasted, against a real
# qlineard on a temporary socket; then qlinearctl's answers to bad input.
#
# Each qlinearctl command is a session of its own, and a weight lives while
# a session holds it (DESIGN §8), or, loaded through the admin socket,
# until an admin unload (persistent: stored, across restarts). ctl_hold (a
# helper beside this script) holds a weight the way a serving process
# would.
set -u
: "${QLINEARD:?run through make check}" "${QLINEARCTL:?}" "${QL_SRCDIR:?}"

dir=$(mktemp -d /tmp/ql-ctl-XXXXXX)
work="$dir/work"
mkdir -p "$work"
chmod 700 "$dir"
pass=0
fail=0
daemon=""
holder=""
hold="$(dirname "$QLINEARD")/tests/integration/ctl_hold"

cleanup() {
  if [ -n "$holder" ]; then kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null; fi
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
expect 0 "example data" -- python3 "$QL_SRCDIR/deploy/example-npy" "$work"
expect 0 "status" -- "$ctl" status
grep -q "cpu" "$dir/out" || bad "status does not list the cpu device"
grep -q "^quantizer *2$" "$dir/out" || bad "status does not say quantizer 2: $(cat "$dir/out")"

# The README's lines, as pasted: a persistent weight outlives qlinearctl's
# own session until an admin unloads it.
expect 1 "persistent load on the request socket" -- "$ctl" load demo/proj "$work/w.npy" --format q4g128 --persistent
grep -q "admin socket" "$dir/err" || bad "no 'admin socket' message: $(cat "$dir/err")"
expect 0 "load --persistent" -- "$ctl" --admin load demo/proj "$work/w.npy" --format q4g128 --bias "$work/b.npy" --persistent
expect 0 "list" -- "$ctl" list
grep -q "demo/proj" "$dir/out" || bad "list does not show demo/proj"
grep -q "demo/proj .* yes  *yes" "$dir/out" || bad "list does not show demo/proj as stored: $(cat "$dir/out")"
ls "$dir/state"/*.safetensors >/dev/null 2>&1 || bad "no store file for demo/proj"
grep -q "q4g128" "$dir/out" || bad "list does not show the format"
expect 0 "linear" -- "$ctl" linear demo/proj "$work/x.npy" -o "$work/y.npy"
# y.npy: [4,256] f32 = 4096 data bytes after a header padded to 64 bytes.
size=$(wc -c <"$work/y.npy")
hdr=$((size - 4 * 256 * 4))
[ "$hdr" -ge 64 ] && [ $((hdr % 64)) -eq 0 ] || bad "y.npy has $size bytes"
grep -q "'shape': (4, 256)" "$work/y.npy" || bad "y.npy shape is not (4, 256)"
expect 0 "linear to stdout" -- "$ctl" linear demo/proj "$work/x.npy"
[ -s "$dir/out" ] || bad "linear printed nothing"
expect 0 "stats" -- "$ctl" stats
grep -q "demo/proj" "$dir/out" || bad "stats does not show demo/proj"
expect 0 "stats --prometheus" -- "$ctl" stats --prometheus
grep -q "^qlinear_" "$dir/out" || bad "no prometheus metrics"
# The same weight again is shared; other content under the name is refused.
expect 0 "load again" -- "$ctl" load demo/proj "$work/w.npy" --format q4g128 --bias "$work/b.npy"
grep -q "shared" "$dir/out" || bad "second load not reported as shared"
expect 1 "load other content" -- "$ctl" load demo/proj "$work/w.npy" --format q8c
grep -qi "exist" "$dir/err" || bad "no 'exists' message: $(cat "$dir/err")"
# The daemon's messages name what the user did, not its internal stages.
grep -q "load_commit\|load_begin\|load_chunk" "$dir/err" &&
  bad "an internal stage name in the message: $(cat "$dir/err")" || ok

# Bad input: clear message, exit 1 (usage errors exit 2).
printf 'not a numpy file' >"$work/bad.npy"
expect 1 "bad npy" -- "$ctl" load x "$work/bad.npy" --format q8c
[ -s "$dir/err" ] || bad "no message for a bad file"
expect 1 "missing file" -- "$ctl" load x "$work/missing.npy" --format q8c
expect 2 "unknown format" -- "$ctl" load x "$work/w.npy" --format q5z
expect 1 "unknown weight" -- "$ctl" linear nope "$work/x.npy"
expect 1 "K mismatch" -- "$ctl" linear demo/proj "$work/b.npy"
expect 2 "unknown command" -- "$ctl" frobnicate
expect 2 "unknown short option in a cluster" -- "$ctl" load -xh
grep -q "'-x'" "$dir/err" || bad "the cluster's unknown option is not named: $(cat "$dir/err")"
expect 2 "unknown long option" -- "$ctl" load x "$work/w.npy" --frob
grep -q "'--frob'" "$dir/err" || bad "the unknown long option is not named: $(cat "$dir/err")"
expect 1 "unload of an admin weight from a session" -- "$ctl" unload demo/proj
expect 2 "reload without --admin" -- "$ctl" reload
expect 0 "reload" -- "$ctl" --admin reload
grep -q "no changes" "$dir/out" || bad "reload report: $(cat "$dir/out")"
expect 0 "unload" -- "$ctl" --admin unload demo/proj
expect 1 "unload again" -- "$ctl" --admin unload demo/proj
ls "$dir/state"/*.safetensors >/dev/null 2>&1 && bad "store file left after unload" || ok

# Without --admin a weight lives while a session holds it. The holder's
# standard input is a FIFO kept open on descriptor 3.
mkfifo "$dir/hold.in"
"$hold" demo/held "$work/w.npy" "$work/b.npy" 128 <"$dir/hold.in" >"$dir/hold.out" 2>&1 &
holder=$!
exec 3>"$dir/hold.in"
i=0
until grep -q "held demo/held" "$dir/hold.out"; do
  i=$((i + 1))
  if [ $i -ge 200 ] || ! kill -0 "$holder" 2>/dev/null; then
    echo "ctl_hold did not hold demo/held:"; cat "$dir/hold.out"; exit 1
  fi
  sleep 0.05
done
expect 0 "load shared" -- "$ctl" load demo/held "$work/w.npy" --format q4g128 --bias "$work/b.npy"
grep -q "shared" "$dir/out" || bad "load of a held weight not reported as shared"
expect 0 "linear on a held weight" -- "$ctl" linear demo/held "$work/x.npy"
# qlinearctl's own hold went with its session; another session's is not
# its to drop.
expect 1 "unload of a weight another session holds" -- "$ctl" unload demo/held
grep -q "other sessions" "$dir/err" || bad "unload: no 'other sessions' message: $(cat "$dir/err")"
# The holder exits: its session ends and takes the weight with it.
exec 3>&-
wait "$holder"
st=$?
holder=""
[ "$st" -eq 0 ] && ok || { bad "ctl_hold exited $st"; cat "$dir/hold.out"; }
i=0
while "$ctl" list >"$dir/out" 2>&1 && grep -q "demo/held" "$dir/out" && [ $i -lt 100 ]; do
  i=$((i + 1)); sleep 0.02
done
grep -q "demo/held" "$dir/out" && bad "demo/held outlived the last session holding it" || ok

# The traps of the CLI: --version; a load without --admin says the weight
# goes with this command; list is sorted; an address of another transport
# is refused at once (only ipc:// is served), and a missing socket says
# so, its directory missing too.
expect 0 "--version" -- "$ctl" --version
grep -q "^qlinearctl [0-9]" "$dir/out" || bad "--version: $(cat "$dir/out")"
expect 0 "load without --admin" -- "$ctl" load demo/brief "$work/w.npy" --format q8c
grep -q "unloaded when qlinearctl exits" "$dir/out" || bad "a session load does not say it ends with the command: $(cat "$dir/out")"
expect 0 "load zz" -- "$ctl" --admin load sort/zz "$work/w.npy" --format q8c --persistent
expect 0 "load aa" -- "$ctl" --admin load sort/aa "$work/w.npy" --format q8c --persistent
expect 0 "load mm" -- "$ctl" --admin load sort/mm "$work/w.npy" --format q8c --persistent
expect 0 "list, sorted" -- "$ctl" list
order=$(grep -o '^sort/[a-z]*' "$dir/out" | tr '\n' ' ')
[ "$order" = "sort/aa sort/mm sort/zz " ] || bad "list is not sorted by name: $order"
for w in sort/zz sort/aa sort/mm; do
  expect 0 "unload $w" -- "$ctl" --admin unload "$w"
done
start=$(date +%s)
expect 1 "a tcp:// address" -- "$ctl" -a tcp://127.0.0.1:1 status
[ $(($(date +%s) - start)) -lt 5 ] || bad "a tcp:// address was not refused at once"
grep -q "ipc:// addresses only" "$dir/err" || bad "tcp:// refusal: $(cat "$dir/err")"
expect 1 "socket directory missing" -- env QLINEAR_ADDRESS="ipc://$dir/nodir/qlineard.sock" "$ctl" status
grep -q "is qlineard running" "$dir/err" || bad "no hint when the socket directory is missing: $(cat "$dir/err")"

# With no per-user daemon, the client finds the system service's socket
# (QLINEAR_SYSTEM_ADDRESS stands in for /run/qlinear/qlineard.sock), and
# --admin its admin socket in <socket dir>-admin.
"$QLINEARD" --socket-dir "$dir/sys" --admin-dir "$dir/sys-admin" --log-level debug 2>"$dir/sys.log" &
sysd=$!
i=0
until [ -S "$dir/sys/qlineard.sock" ] && [ -S "$dir/sys-admin/admin.sock" ]; do
  i=$((i + 1)); [ $i -lt 200 ] || { bad "the second daemon did not start"; cat "$dir/sys.log"; break; }
  sleep 0.05
done
mkdir -p "$dir/rt"
expect 0 "the system service's socket" -- env -u QLINEAR_ADDRESS XDG_RUNTIME_DIR="$dir/rt" QLINEAR_SYSTEM_ADDRESS="ipc://$dir/sys/qlineard.sock" "$ctl" status
grep -q "ipc://$dir/sys/qlineard.sock" "$dir/out" || bad "status did not reach the system socket: $(cat "$dir/out" "$dir/err")"
expect 0 "the system service's admin socket" -- env -u QLINEAR_ADDRESS -u QLINEAR_ADMIN_ADDRESS XDG_RUNTIME_DIR="$dir/rt" QLINEAR_SYSTEM_ADDRESS="ipc://$dir/sys/qlineard.sock" "$ctl" --admin list
# A per-user daemon, when there is one, comes first.
expect 0 "the per-user socket first" -- env -u QLINEAR_ADDRESS XDG_RUNTIME_DIR="$dir/userrt" QLINEAR_SYSTEM_ADDRESS="ipc://$dir/sys/qlineard.sock" sh -c 'mkdir -p "$XDG_RUNTIME_DIR" && ln -s "$1" "$XDG_RUNTIME_DIR/qlinear" && "$2" status' sh "$dir/sock" "$ctl"
grep -q "qlinear/qlineard.sock" "$dir/out" && ! grep -q "$dir/sys/" "$dir/out" || bad "the system socket was taken over a running per-user daemon: $(cat "$dir/out")"
kill -TERM "$sysd"
wait "$sysd" || bad "the second daemon exited $?"

# The daemon survived all of it and stops cleanly.
kill -TERM "$daemon"
wait "$daemon"
st=$?
daemon=""
[ "$st" -eq 0 ] && ok || bad "qlineard exited $st on SIGTERM"
[ -e "$dir/sock/qlineard.sock" ] && bad "socket left behind" || ok
if [ "$fail" -ne 0 ]; then
  echo "---- daemon log"; tail -30 "$dir/daemon.log"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
