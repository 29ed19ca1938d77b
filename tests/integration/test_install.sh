#!/bin/sh
# test_install.sh - `make install DESTDIR=<tmp>` from the build tree puts
# every file where the configured directories say (the daemon, qlinearctl,
# libqlinear and its headers, qlinear.pc, the unit, the sysusers.d and
# tmpfiles.d snippets, the config); the unit runs the installed daemon with
# the installed config; pkg-config finds the installed library, and a
# small client compiles, links and runs against it. A second install keeps
# an edited qlineard.conf, and uninstall removes everything else.
set -u
: "${QL_MAKE:?run through make check}" "${QL_BUILDDIR:?}" "${QL_BINDIR:?}"
: "${QL_LIBDIR:?}" "${QL_INCLUDEDIR:?}" "${QL_SYSCONFDIR:?}" "${QL_UNITDIR:?}"
: "${QL_SYSUSERSDIR:?}" "${QL_TMPFILESDIR:?}" "${QL_PKGCONFIGDIR:?}"

work=$(mktemp -d /tmp/ql-install-XXXXXX)
trap 'rm -rf "$work"' EXIT
dest="$work/root"
fail=0
bad() { fail=1; echo "FAIL: $*"; }

# A make of its own: the jobserver and flags of the make running the tests
# are not ours to share.
run_make() {
  (cd "$QL_BUILDDIR" && unset MAKEFLAGS MFLAGS MAKELEVEL &&
    "$QL_MAKE" --no-print-directory "$@" DESTDIR="$dest") \
    >"$work/make.log" 2>&1 || {
    tail -40 "$work/make.log"
    echo "FAIL: make $* DESTDIR=$dest"
    exit 1
  }
}

run_make install
echo "installed into $dest"

conf="$QL_SYSCONFDIR/qlinear"
for f in "$QL_BINDIR/qlineard" "$QL_BINDIR/qlinearctl"; do
  [ -x "$dest$f" ] || bad "$f is missing or not executable"
done
for f in "$QL_LIBDIR/libqlinear.so" "$QL_INCLUDEDIR/qlinear/qlinear.h" \
  "$QL_INCLUDEDIR/qlinear/ql_defs.h" "$QL_INCLUDEDIR/qlinear/qlinear_cuda.h" \
  "$QL_INCLUDEDIR/qlinear/qlinear_ze.h" \
  "$QL_PKGCONFIGDIR/qlinear.pc" \
  "$QL_UNITDIR/qlineard.service" "$QL_UNITDIR/qlineard-metrics.socket" \
  "$QL_SYSUSERSDIR/qlinear.conf" \
  "$QL_TMPFILESDIR/qlinear.conf" "$conf/qlineard.conf.example" \
  "$conf/qlineard.conf"; do
  [ -f "$dest$f" ] || bad "$f is missing"
done
cmp -s "$dest$conf/qlineard.conf.example" "$dest$conf/qlineard.conf" ||
  bad "the first install's qlineard.conf is not the example"

# The unit runs the installed daemon with the installed config.
unit="$dest$QL_UNITDIR/qlineard.service"
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
echo "ExecStart=$exec_start"
set -- $exec_start
[ "${1:-}" = "$QL_BINDIR/qlineard" ] ||
  bad "ExecStart runs '${1:-}', not $QL_BINDIR/qlineard"
[ "${2:-}" = "--config" ] && [ "${3:-}" = "$conf/qlineard.conf" ] ||
  bad "ExecStart does not read $conf/qlineard.conf"
[ -x "$dest${1:-/nonexistent}" ] || bad "ExecStart's binary is not installed"
"$dest$QL_BINDIR/qlineard" --version || bad "the installed qlineard does not run"

# pkg-config against the installed qlinear.pc only, its paths under DESTDIR.
PKG_CONFIG_LIBDIR="$dest$QL_PKGCONFIGDIR"
PKG_CONFIG_PATH=
PKG_CONFIG_SYSROOT_DIR="$dest"
export PKG_CONFIG_LIBDIR PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
if flags=$(pkg-config --cflags --libs qlinear); then
  echo "pkg-config --cflags --libs qlinear: $flags"
  case " $flags " in
  *" -I$dest$QL_INCLUDEDIR "*) ;;
  *) bad "cflags lack -I$dest$QL_INCLUDEDIR" ;;
  esac
  case " $flags " in
  *" -L$dest$QL_LIBDIR "*) ;;
  *) bad "libs lack -L$dest$QL_LIBDIR" ;;
  esac
  case " $flags " in
  *" -lqlinear "*) ;;
  *) bad "libs lack -lqlinear" ;;
  esac
else
  bad "pkg-config --cflags --libs qlinear failed"
  flags="-I$dest$QL_INCLUDEDIR -L$dest$QL_LIBDIR -lqlinear"
fi
pkg-config --modversion qlinear || bad "pkg-config --modversion qlinear"

# A client as a user writes it: the installed header and library only (no
# -I into the source tree), then run against the installed .so.
cat >"$work/client.c" <<'EOF'
#include <qlinear/qlinear.h>
#include <stdio.h>
int main(void) {
  ql_client *c;
  int rc = ql_connect("ipc:///nonexistent/qlinear/qlineard.sock", NULL, &c);
  printf("%s: %s\n", ql_err_name(rc), ql_strerror(rc));
  return rc == QL_ECONNECT && c == NULL ? 0 : 1;
}
EOF
# shellcheck disable=SC2086
if ${QL_CC:-cc} -std=c11 -Wall -Werror ${QL_SAN_FLAGS:-} -o "$work/client" \
  "$work/client.c" $flags; then
  LD_LIBRARY_PATH="$dest$QL_LIBDIR" "$work/client" ||
    bad "the client linked against the installed library did not run"
else
  bad "a client does not compile against the installed header and library"
fi

# The README's C quick start, as printed there, built against the
# installed tree and run against the installed daemon: it must connect,
# load, compute and print y.
sed -n '/^\/\* quickstart.c: /,/^```$/p' "$QL_SRCDIR/README.md" | sed '$d' \
  >"$work/quickstart.c"
if [ "$(wc -l <"$work/quickstart.c")" -lt 15 ]; then
  bad "no quick start program in README.md"
elif ${QL_CC:-cc} -std=c11 -Wall -Wextra -Werror ${QL_SAN_FLAGS:-} \
  -o "$work/quickstart" "$work/quickstart.c" $flags; then
  qs="$work/qs-sock"
  "$dest$QL_BINDIR/qlineard" --socket-dir "$qs" --crossover-rows 16 \
    2>"$work/qs-daemon.log" &
  qsd=$!
  i=0
  until [ -S "$qs/qlineard.sock" ] && [ -S "$qs/admin/admin.sock" ]; do
    i=$((i + 1))
    [ $i -lt 200 ] || break
    sleep 0.05
  done
  if QLINEAR_ADDRESS="ipc://$qs/qlineard.sock" LD_LIBRARY_PATH="$dest$QL_LIBDIR" \
    "$work/quickstart" >"$work/qs.out" 2>&1 &&
    grep -q '^y\[0\]\[0\.\.3\] = ' "$work/qs.out"; then
    cat "$work/qs.out"
  else
    bad "the README's quick start did not run: $(cat "$work/qs.out" "$work/qs-daemon.log")"
  fi
  kill -TERM "$qsd"
  wait "$qsd" || bad "the installed qlineard exited $? on SIGTERM"
else
  bad "the README's quick start does not compile against the installed tree"
fi

# Reinstalling keeps an edited config; uninstall removes everything else.
echo "# edited" >>"$dest$conf/qlineard.conf"
run_make install
grep -q '^# edited' "$dest$conf/qlineard.conf" ||
  bad "a second install replaced an edited qlineard.conf"
run_make uninstall
left=$(cd "$dest" && find . ! -type d | sort)
if [ "$left" != ".$conf/qlineard.conf" ]; then
  echo "left after uninstall:"; echo "$left"
  bad "uninstall should leave exactly the edited qlineard.conf"
fi

[ "$fail" -eq 0 ] && echo "ok: make install and uninstall"
exit $fail
