#!/bin/sh
# test_layout.sh - the layout the README describes is the tree's: every
# daemon source file is named in its Layout table, and every file the
# table names exists (so neither can drift from the other); and client/
# includes no header of the daemon's.
set -u
: "${QL_SRCDIR:?run through make check}"
readme=$QL_SRCDIR/README.md
row=$(grep '^| `daemon/` |' "$readme") || {
  echo "FAIL: README.md has no Layout row for daemon/"
  exit 1
}
fails=0
for f in "$QL_SRCDIR"/daemon/*.c; do
  b=$(basename "$f")
  case $row in
  *"\`$b\`"*) ;;
  *)
    echo "FAIL: daemon/$b is not in README.md's Layout table"
    fails=$((fails + 1))
    ;;
  esac
done
for b in $(echo "$row" | grep -o '`[a-z_]*\.c`' | tr -d '`'); do
  if [ ! -f "$QL_SRCDIR/daemon/$b" ]; then
    echo "FAIL: README.md's Layout names daemon/$b, which does not exist"
    fails=$((fails + 1))
  fi
done
# client/ speaks the protocol only (DESIGN's layout): none of its files
# includes a header that only the daemon has.
for f in "$QL_SRCDIR"/client/*/*.c "$QL_SRCDIR"/client/*/*.cpp \
  "$QL_SRCDIR"/client/*/*.h "$QL_SRCDIR"/client/include/qlinear/*.h; do
  [ -f "$f" ] || continue
  for h in $(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f"); do
    b=$(basename "$h")
    if [ -f "$QL_SRCDIR/daemon/$b" ] && [ ! -f "$(dirname "$f")/$b" ] &&
      [ ! -f "$QL_SRCDIR/client/include/qlinear/$b" ] &&
      [ ! -f "$QL_SRCDIR/proto/$b" ]; then
      echo "FAIL: ${f#"$QL_SRCDIR"/} includes daemon/$b"
      fails=$((fails + 1))
    fi
  done
done
[ "$fails" -eq 0 ] || exit 1
echo "PASS: README.md's Layout names every daemon source file; client/ includes nothing of daemon/"
