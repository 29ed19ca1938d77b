#!/bin/sh
# Regenerates configure and Makefile.in (never committed).
set -e
cd "$(dirname "$0")"
mkdir -p m4 build-aux
exec autoreconf -fi
