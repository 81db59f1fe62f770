#!/bin/bash
# run.sh NAME ARGS...: one harness run with uptime before/after
name=$1; shift
out=${OUT:-.}/$name.txt
{ echo "# $(date -u +%FT%TZ) go run $*"; echo "# uptime before: $(uptime)"; } > $out
nice -n 10 go run "$@" >> $out 2>&1
rc=$?
{ echo "# rc=$rc"; echo "# uptime after: $(uptime)"; echo "# $(date -u +%FT%TZ)"; } >> $out
