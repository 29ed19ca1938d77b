#!/bin/sh
# test_man.sh - the manual pages say what the programs do, and render.
#
# - Every --flag that `qlineard --help` prints has an entry (a .TP or .TQ
#   tag) in man/qlineard.8; every flag, short or long, and every command
#   that `qlinearctl --help` prints has one in man/qlinearctl.1.
# - Every option of `qlineard --print-config` has an entry in the
#   generated qlineard.conf.5, which is what `qlineard --print-man-conf`
#   prints now, whatever the environment.
# - Each of the four pages renders with `man -l` (else groff) with no
#   warning, and `make install-man` installs them.
# - The comparisons find what they should: a made-up flag, option or
#   command, and a broken page, are reported (so this test can fail).
set -u
: "${QLINEARD:?run through make check}" "${QLINEARCTL:?}" "${QL_SRCDIR:?}"
: "${QL_BUILDDIR:?}" "${QL_MAKE:?}" "${QL_MANDIR:?}"

work=$(mktemp -d /tmp/ql-man-XXXXXX)
trap 'rm -rf "$work"' EXIT
fails=0
bad() {
  echo "FAIL: $*"
  fails=$((fails + 1))
}
have() { command -v "$1" >/dev/null 2>&1; }

daemon_page=$QL_SRCDIR/man/qlineard.8
ctl_page=$QL_SRCDIR/man/qlinearctl.1
lib_page=$QL_SRCDIR/man/libqlinear.3
conf_page=$QL_BUILDDIR/man/qlineard.conf.5

# --------------------------------------------------------- the comparisons

# A page's source as its reader sees the words: font changes, \& and the
# escapes of '-' and quotes taken out.
page_text() {
  sed -e 's/\\f[BIRP]//g' -e 's/\\f([A-Z][A-Z]//g' -e 's/\\&//g' \
    -e 's/\\-/-/g' -e 's/\\(dq/"/g' -e 's/\\ / /g' "$1"
}

# The words of a page's entries: its .TP and .TQ tag lines (the line after
# the macro), without the font macro, quotes and commas; one a line.
page_tags() {
  page_text "$1" | awk '
    tag { sub(/^\.[A-Z]+ +/, ""); gsub(/["|,]/, " ");
          n = split($0, w, / +/); for (i = 1; i <= n; i++) print w[i];
          tag = 0; next }
    /^\.(TP|TQ)( |$)/ { tag = 1 }' | sort -u
}

# The long flags a --help text names: lower case, so not the --OPTION
# placeholder.
help_flags() { grep -oE -- '--[a-z][a-z0-9-]*' "$1" | sort -u; }

# Its short options: -x alone, or before a comma, a blank or a bracket.
help_short() {
  grep -oE -- '(^|[][ ,])-[a-zA-Z]([], ]|$)' "$1" |
    grep -oE -- '-[a-zA-Z]' | sort -u
}

# The commands of qlinearctl's help: the lines of its "commands:" block
# that start with two blanks and a word.
help_commands() {
  sed -n '/^commands:/,/^$/p' "$1" |
    sed -n 's/^  \([a-z][a-z0-9-]*\).*/\1/p' | sort -u
}

# The options of a --print-config output.
config_keys() { sed -n 's/^\([a-z][a-z0-9_]*\) = .*/\1/p' "$1" | sort -u; }

# missing LIST PAGE: the words of the file LIST (one a line) that no entry
# of PAGE has, whole (--max-queue is not --max-queue-delay-us).
missing() {
  page_tags "$2" >"$work/tags"
  grep -vxF -f "$work/tags" "$1" || true
}

# check WHAT LIST PAGE: each word of LIST must have an entry in PAGE.
check() {
  m=$(missing "$2" "$3")
  if [ -n "$m" ]; then
    for w in $m; do
      bad "$1 '$w' has no entry in $(basename "$3")"
    done
  else
    echo "ok: every $1 ($(wc -l <"$2" | tr -d ' ')) has an entry in" \
      "$(basename "$3")"
  fi
}

# render PAGE: no output on success; the warnings (or why it failed)
# otherwise. man -l renders as a reader would, groff -ww says what is
# questionable; both where both exist (man-db needs groff-base anyway).
render() {
  : >"$work/render.err"
  if have man; then
    if ! MANWIDTH=80 man -l -Tutf8 "$1" >"$work/render.out" \
      2>>"$work/render.err"; then
      echo "man -l failed"
    elif ! sed 's/.\x08//g' "$work/render.out" | grep -q '^NAME'; then
      echo "man -l rendered no NAME section"
    fi
  fi
  if have groff; then
    groff -man -Tutf8 -ww -z "$1" 2>>"$work/render.err" ||
      echo "groff failed"
  fi
  cat "$work/render.err"
}

# ------------------------------------------------- the comparisons can fail

"$QLINEARD" --help >"$work/qlineard.help" 2>&1 ||
  bad "qlineard --help failed"
"$QLINEARCTL" --help >"$work/qlinearctl.help" 2>&1 ||
  bad "qlinearctl --help failed"

# A made-up flag in qlineard's help, and one that only prefixes a real one.
{
  cat "$work/qlineard.help"
  echo "  --zz-made-up-flag N"
} >"$work/fake.help"
help_flags "$work/fake.help" >"$work/fake.flags"
missing "$work/fake.flags" "$daemon_page" | grep -qx -- --zz-made-up-flag ||
  bad "self-test: a made-up qlineard flag is not reported missing"
printf '.TH X 8\n.SH OPTIONS\n.TP\n.BI \\-\\-max\\-queue\\-delay\\-us " N"\n' \
  >"$work/fake.8"
printf '  --max-queue N\n  --max-queue-delay-us N\n' >"$work/prefix.help"
help_flags "$work/prefix.help" >"$work/prefix.flags"
[ "$(missing "$work/prefix.flags" "$work/fake.8")" = "--max-queue" ] ||
  bad "self-test: --max-queue counts as documented by --max-queue-delay-us"
# A made-up command and short option in qlinearctl's.
sed -e 's/^commands:$/commands:\n  frobnicate             made up/' \
  -e 's/^options:$/options:\n  -Z                     made up/' \
  "$work/qlinearctl.help" >"$work/fake-ctl.help"
help_commands "$work/fake-ctl.help" >"$work/fake.cmds"
missing "$work/fake.cmds" "$ctl_page" | grep -qx frobnicate ||
  bad "self-test: a made-up qlinearctl command is not reported missing"
help_short "$work/fake-ctl.help" >"$work/fake.short"
missing "$work/fake.short" "$ctl_page" | grep -qx -- -Z ||
  bad "self-test: a made-up qlinearctl short option is not reported missing"
# A made-up option of the configuration.
{
  "$QLINEARD" --print-config
  echo "zz_made_up = 1"
} >"$work/fake.conf"
config_keys "$work/fake.conf" >"$work/fake.keys"
if [ -f "$conf_page" ]; then
  missing "$work/fake.keys" "$conf_page" | grep -qx zz_made_up ||
    bad "self-test: a made-up configuration option is not reported missing"
fi
# A page with an unknown macro and a bad escape.
printf '.TH X 1\n.SH NAME\nx \\- y\n.ZZ made up\n\\fQz\n' >"$work/broken.1"
if have man || have groff; then
  [ -n "$(render "$work/broken.1")" ] ||
    bad "self-test: a broken page renders without a warning"
fi
[ "$fails" -eq 0 ] && echo "ok: the comparisons report a made-up flag," \
  "command and option$(have man || have groff && echo ', and a broken page')"

# ------------------------------------------------------------- the pages

help_flags "$work/qlineard.help" >"$work/qlineard.flags"
[ -s "$work/qlineard.flags" ] || bad "no flag found in qlineard --help"
check "qlineard flag" "$work/qlineard.flags" "$daemon_page"

help_flags "$work/qlinearctl.help" >"$work/ctl.flags"
help_short "$work/qlinearctl.help" >>"$work/ctl.flags"
help_commands "$work/qlinearctl.help" >"$work/ctl.cmds"
[ -s "$work/ctl.flags" ] || bad "no flag found in qlinearctl --help"
[ -s "$work/ctl.cmds" ] || bad "no command found in qlinearctl --help"
check "qlinearctl flag" "$work/ctl.flags" "$ctl_page"
check "qlinearctl command" "$work/ctl.cmds" "$ctl_page"

if [ ! -f "$conf_page" ]; then
  bad "$conf_page is missing (make builds it from qlineard --print-man-conf)"
else
  "$QLINEARD" --print-config >"$work/print.conf" ||
    bad "qlineard --print-config failed"
  config_keys "$work/print.conf" >"$work/conf.keys"
  [ -s "$work/conf.keys" ] || bad "no option found in qlineard --print-config"
  check "configuration option" "$work/conf.keys" "$conf_page"
  # Up to date, and the same whatever the environment says.
  for xdg in unset /run/user/4242; do
    if [ "$xdg" = unset ]; then
      (unset XDG_RUNTIME_DIR; "$QLINEARD" --print-man-conf) >"$work/gen.5"
    else
      XDG_RUNTIME_DIR=$xdg "$QLINEARD" --print-man-conf >"$work/gen.5"
    fi
    cmp -s "$work/gen.5" "$conf_page" ||
      bad "$conf_page is not what qlineard --print-man-conf prints" \
        "(XDG_RUNTIME_DIR $xdg)"
  done
fi

# ------------------------------------------------------------ rendering

if have man || have groff; then
  tools=$(have man && echo "man -l -Tutf8")
  have groff && tools="${tools:+$tools and }groff -man -Tutf8 -ww -z"
  for p in "$daemon_page" "$ctl_page" "$lib_page" "$conf_page"; do
    [ -f "$p" ] || continue
    out=$(render "$p")
    if [ -n "$out" ]; then
      bad "$(basename "$p") does not render cleanly:"
      echo "$out" | sed 's/^/  /'
    else
      echo "ok: $(basename "$p") renders with $tools, no warning"
    fi
  done
else
  bad "neither man nor groff is installed: install the Debian packages" \
    "man-db and groff-base (deploy/bootstrap does)"
fi

# ------------------------------------------------------------ installing

dest=$work/root
before=$fails
if (cd "$QL_BUILDDIR" && unset MAKEFLAGS MFLAGS MAKELEVEL &&
  "$QL_MAKE" --no-print-directory install-man DESTDIR="$dest") \
  >"$work/make.log" 2>&1; then
  for f in man8/qlineard.8 man5/qlineard.conf.5 man1/qlinearctl.1 \
    man3/libqlinear.3; do
    [ -f "$dest$QL_MANDIR/$f" ] || bad "make install-man did not install $f"
  done
  [ "$fails" -eq "$before" ] &&
    echo "ok: make install-man installs the four pages"
else
  tail -20 "$work/make.log"
  bad "make install-man DESTDIR=$dest"
fi

[ "$fails" -eq 0 ] || exit 1
echo "PASS: the manual pages"
