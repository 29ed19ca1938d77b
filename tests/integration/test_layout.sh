#!/bin/sh
# test_layout.sh - the layout the README describes is the tree's: every
# daemon source file is named in its folder's row of the Layout table, and
# every file the table names exists (so neither can drift from the other);
# and client/ includes no header of the daemon's.
set -u
: "${QL_SRCDIR:?run through make check}"
readme=$QL_SRCDIR/README.md
fails=0
# One row per folder of daemon/ (and one for its root): each names every
# .c file of its folder, and names no file the folder lacks.
for dir in "$QL_SRCDIR"/daemon "$QL_SRCDIR"/daemon/*/; do
  [ -d "$dir" ] || continue
  dir=${dir%/}
  rel=${dir#"$QL_SRCDIR"/}
  row=$(grep "^| \`$rel/\` |" "$readme") || {
    echo "FAIL: README.md has no Layout row for $rel/"
    fails=$((fails + 1))
    continue
  }
  for f in "$dir"/*.c; do
    [ -f "$f" ] || continue
    b=$(basename "$f")
    case $row in
    *"\`$b\`"*) ;;
    *)
      echo "FAIL: $rel/$b is not in README.md's Layout row for $rel/"
      fails=$((fails + 1))
      ;;
    esac
  done
  for b in $(echo "$row" | grep -o '`[a-z_]*\.c`' | tr -d '`'); do
    if [ ! -f "$dir/$b" ]; then
      echo "FAIL: README.md's Layout row for $rel/ names $b, which is not there"
      fails=$((fails + 1))
    fi
  done
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
