#!/bin/sh
# ptxas_check.sh REPORT - fails when the ptxas report (nvcc -Xptxas -v
# output) of a kernel build shows a register spill, or shows no kernel at
# all (a report that is not one must not pass). Prints one summary line:
# kernels compiled and the most registers one uses.
set -eu
report=$1
awk '
/Compiling entry function/ { fn = $0; sub(/.*function .\047?/, "", fn); sub(/\047.*/, "", fn) }
/bytes spill stores/ {
  n++
  for (i = 1; i < NF; i++)
    if (($(i + 1) == "bytes" && ($(i + 2) == "spill")) && $i + 0 > 0) {
      print "ptxas_check: register spill in " fn ": " $0; bad = 1
    }
}
/Used [0-9]+ registers/ {
  for (i = 1; i < NF; i++) if ($i == "Used") r = $(i + 1) + 0
  if (r > max) max = r
}
END {
  if (n == 0) { print "ptxas_check: no kernel in the report (is -Xptxas -v set?)"; exit 1 }
  if (bad) exit 1
  printf "ptxas_check: %d kernel builds, no spills, at most %d registers\n", n, max
}' "$report"
