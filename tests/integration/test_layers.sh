#!/bin/sh
# test_layers.sh - daemon/'s folders are its layers (README's Layout,
# ../shared/ARCHITECTURE.md §3.2), and no folder includes one above it:
#
#   folder     may include (daemon/)                        and outside daemon/
#   wire/      wire/, log.h                                 proto/
#   net/       wire/, net/, log.h                           proto/
#   state/     wire/, state/, log.h conf.h heap.h qlineard.h  proto/, kernels/
#              (every layer may also include faults.h, the test hooks)
#   dispatch/  wire/, state/, dispatch/, the same root headers
#   serve/     wire/, net/, state/, dispatch/, serve/, those and notify.h
#   (root)     anything
#
# (state/ -> qlineard.h is the one arrow that still runs up: devices.c and
# session.c take the server; it is allowed until they take objects of
# their own.) Headers of a folder are included by their path from daemon/
# ("state/weights.h"); a bare name is allowed for the root's headers only.
# Any include the table does not allow fails, with the file, the line and
# why; so does any circle of includes between modules (a .c with its .h). Before checking the tree, the check is run on a copy with a
# forbidden include added, which it must refuse.
set -u
: "${QL_SRCDIR:?run through make check}"

# check_tree DIR: the rules above over DIR/daemon; prints each violation,
# returns the count (capped at 255 by the shell).
check_tree() {
  top=$1
  n=0
  for f in "$top"/daemon/*/*.c "$top"/daemon/*/*.h; do
    [ -f "$f" ] || continue
    rel=${f#"$top"/daemon/}
    layer=${rel%%/*}
    case $layer in
    wire) dirs="wire" roots="log.h faults.h" outside="proto" ;;
    net) dirs="wire net" roots="log.h faults.h" outside="proto" ;;
    state) dirs="wire state" roots="log.h faults.h conf.h heap.h qlineard.h" outside="proto kernels" ;;
    dispatch) dirs="wire state dispatch" roots="log.h faults.h conf.h heap.h qlineard.h" outside="proto kernels" ;;
    serve) dirs="wire net state dispatch serve" roots="log.h faults.h conf.h heap.h qlineard.h notify.h" outside="proto kernels" ;;
    *)
      echo "FAIL: daemon/$rel: $layer/ is not a layer of the table"
      n=$((n + 1))
      continue
      ;;
    esac
    # "path" of every quoted include, with its line number
    grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
      sed 's/^\([0-9]*\):.*"\([^"]*\)".*/\1 \2/' >"$tmp/inc"
    while read -r line inc; do
      why=""
      case $inc in
      config.h | qlinear.pb-c.h) continue ;; # autoconf's, protoc-c's
      ../* | */../*) why="a relative path: write it from daemon/" ;;
      */*)
        d=${inc%%/*}
        if [ -f "$top/daemon/$inc" ]; then
          case " $dirs " in
          *" $d "*) ;;
          *) why="$layer/ must not include $d/" ;;
          esac
        else
          why="no such header under daemon/"
        fi
        ;;
      *)
        if [ -f "$top/daemon/$inc" ]; then
          case " $roots " in
          *" $inc "*) ;;
          *) why="$layer/ must not include the root's $inc" ;;
          esac
        elif [ -f "$(dirname "$f")/$inc" ]; then
          why="write it as its path, $layer/$inc"
        else
          found=""
          for o in $outside; do
            for g in "$top/$o/$inc" "$top"/$o/*/"$inc"; do
              [ -f "$g" ] && found=$o
            done
          done
          if [ -z "$found" ]; then
            for g in "$top"/daemon/*/"$inc" "$top"/kernels/"$inc" "$top"/client/include/qlinear/"$inc"; do
              [ -f "$g" ] && why="$inc is not in reach of $layer/ (${g#"$top"/})"
            done
          fi
        fi
        ;;
      esac
      if [ -n "$why" ]; then
        echo "FAIL: daemon/$rel:$line: #include \"$inc\": $why"
        n=$((n + 1))
      fi
    done <"$tmp/inc"
  done
  return $((n > 255 ? 255 : n))
}

# include_edges TOP: "from to" per quoted include between two daemon
# modules (a module: a .c and its .h, by path from daemon/, no suffix).
include_edges() {
  top=$1
  for f in "$top"/daemon/*.c "$top"/daemon/*.h "$top"/daemon/*/*.c "$top"/daemon/*/*.h; do
    [ -f "$f" ] || continue
    rel=${f#"$top"/daemon/}
    from=${rel%.*}
    dir=$(dirname "$rel")
    grep -h '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
      sed 's/.*"\([^"]*\)".*/\1/' | while read -r inc; do
        if [ -f "$top/daemon/$inc" ]; then
          to=${inc%.*}
        elif [ "$dir" != . ] && [ -f "$top/daemon/$dir/$inc" ]; then
          to=$dir/${inc%.*}
        else
          continue
        fi
        [ "$to" != "$from" ] && echo "$from $to"
      done
  done | sort -u
}

# circles: reads edges, prints one line per circle found ("a -> b -> a"),
# by depth-first search.
circles() {
  awk '
    { if (!(($1, $2) in seen)) { seen[$1, $2] = 1; out[$1] = out[$1] " " $2 }
      node[$1] = 1; node[$2] = 1 }
    function visit(v, d,   n, i, j, w, list, c) {
      state[v] = 1; pos[v] = d; stk[d] = v
      n = split(out[v], list, " ")
      for (i = 1; i <= n; i++) {
        w = list[i]
        if (state[w] == 1) {
          c = ""
          for (j = pos[w]; j <= d; j++) c = c stk[j] " -> "
          print c w; found++
        } else if (state[w] == 0) visit(w, d + 1)
      }
      state[v] = 2
    }
    END { for (v in node) if (state[v] == 0) visit(v, 0); exit found > 0 }'
}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ql-layers.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

# The check must refuse what it is for: a copy of the tree where state/
# includes serve/, net/ includes state/, and a folder's header is included
# by its bare name.
mkdir -p "$tmp/copy"
cp -R "$QL_SRCDIR/daemon" "$QL_SRCDIR/proto" "$QL_SRCDIR/kernels" "$tmp/copy/"
printf '#include "serve/handlers.h"\n' >>"$tmp/copy/daemon/state/weights.c"
printf '#include "state/weights.h"\n' >>"$tmp/copy/daemon/net/transport.c"
printf '#include "reply.h"\n' >>"$tmp/copy/daemon/wire/protocol.c"
# (and a circle inside one layer, which the table allows: weights.c
# includes store.h already)
printf '#include "state/weights.h"\n' >>"$tmp/copy/daemon/state/store.c"
out=$(check_tree "$tmp/copy")
for want in 'state/weights.c:.*"serve/handlers.h": state/ must not include serve/' \
  'net/transport.c:.*"state/weights.h": net/ must not include state/' \
  'wire/protocol.c:.*"reply.h": write it as its path, wire/reply.h'; do
  if ! printf '%s\n' "$out" | grep -q "$want"; then
    echo "FAIL: self-test: the check did not refuse: $want"
    printf '%s\n' "$out"
    exit 1
  fi
done
echo "self-test: refused, as it must:"
printf '%s\n' "$out" | sed 's/^/  /'
circ=$(include_edges "$tmp/copy" | circles)
if ! printf '%s\n' "$circ" | grep -q 'store -> state/weights\|weights -> state/store'; then
  echo "FAIL: self-test: the circle check did not see state/weights <-> state/store"
  printf '%s\n' "$circ"
  exit 1
fi
echo "self-test: the circle seen, as it must be:"
printf '%s\n' "$circ" | sed 's/^/  /'

out=$(check_tree "$QL_SRCDIR")
rc=$?
if [ "$rc" -ne 0 ]; then
  printf '%s\n' "$out"
  echo "FAIL: $rc include(s) against daemon/'s layers"
  exit 1
fi
# No include circle either, inside a layer or through the root: a module
# is a .c with its .h, and no chain of includes leads from one back to it.
circ=$(include_edges "$QL_SRCDIR" | circles)
if [ -n "$circ" ]; then
  printf '%s\n' "$circ"
  echo "FAIL: include circles in daemon/ (each line: one, as found)"
  exit 1
fi
echo "PASS: every include in daemon/'s folders follows the layer table, and no include makes a circle"
