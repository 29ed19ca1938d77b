#!/bin/sh
# The module checks of kernels/ze/build_spirv.sh (--check-dis) on made-up
# spirv-dis listings: a good module passes in each variant; a missing or
# extra kernel, a missing ContractionOff, LocalSize or SubgroupSize, a
# contracted mad, and sub-group capabilities in the local-memory variant
# each fail it.
set -u
check="${QL_SRCDIR:-.}/kernels/ze/build_spirv.sh"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fails=0

# listing FILE [drop-pattern] [extra-line]: a two-kernel module
listing() {
  cat <<EOL | grep -v -e "${2:-^NOTHING$}" >"$1"
               OpCapability Addresses
               OpCapability Kernel
               OpCapability Groups
               OpCapability SubgroupDispatch
          %1 = OpExtInstImport "OpenCL.std"
               OpEntryPoint Kernel %10 "ka" %xl %__spirv_BuiltInLocalInvocationId
               OpEntryPoint Kernel %11 "kb" %__spirv_BuiltInWorkgroupId
               OpExecutionMode %10 LocalSize 64 1 1
               OpExecutionMode %10 ContractionOff
               OpExecutionMode %10 SubgroupSize 16
               OpExecutionMode %11 LocalSize 64 1 1
               OpExecutionMode %11 ContractionOff
               OpExecutionMode %11 SubgroupSize 16
         %20 = OpExtInst %float %1 fma %16 %17 %18
EOL
  [ -n "${3:-}" ] && echo "$3" >>"$1"
  return 0
}
expect() { # $1 want status (0/1), $2 what, then the check's arguments
  want=$1
  what=$2
  shift 2
  sh "$check" --check-dis "$@" >"$dir/out" 2>&1
  st=$?
  [ "$st" -ne 0 ] && st=1
  if [ "$st" -ne "$want" ]; then
    echo "FAIL $what: status $st, want $want"
    cat "$dir/out"
    fails=$((fails + 1))
  else
    echo "ok   $what $(head -1 "$dir/out")"
  fi
}

listing "$dir/sg"
expect 0 "sub-group module" "$dir/sg" sg ka kb
listing "$dir/lm" "Groups\|SubgroupDispatch\|SubgroupSize"
expect 0 "local-memory module" "$dir/lm" lm ka kb
expect 1 "missing kernel" "$dir/sg" sg ka kb kc
expect 1 "extra kernel" "$dir/sg" sg ka
listing "$dir/x" "%11 ContractionOff"
expect 1 "no ContractionOff" "$dir/x" sg ka kb
listing "$dir/x" "%10 LocalSize"
expect 1 "no LocalSize" "$dir/x" sg ka kb
listing "$dir/x" "%11 SubgroupSize"
expect 1 "no SubgroupSize" "$dir/x" sg ka kb
listing "$dir/x" "" "         %21 = OpExtInst %float %1 mad %16 %17 %18"
expect 1 "contracted mad" "$dir/x" sg ka kb
listing "$dir/x" "SubgroupDispatch\|SubgroupSize"
expect 1 "sub-group capability in lm" "$dir/x" lm ka kb
: >"$dir/empty"
expect 1 "empty listing" "$dir/empty" lm ka

[ "$fails" -eq 0 ] || exit 1
