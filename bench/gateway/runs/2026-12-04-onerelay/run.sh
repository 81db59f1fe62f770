#!/bin/bash
cd "$BASE"  # a checkout of main at 2be130b (both relays)
export EVENTPIPE_BIN_DIR="$BIN"
nice -n 5 go build -o "$OUT"/harness ./bench/gateway || exit 1
for r in 1 2 3 4; do
  if [ $((r % 2)) = 1 ]; then order="grpc frame"; else order="frame grpc"; fi
  for m in $order; do
    out="$OUT"/r$r-$m.txt
    { echo "# $(date -u +%T) uptime: $(uptime)"; echo "# pressure: $(head -1 /proc/pressure/cpu)";
      "$OUT"/harness -n 2000 -restarts 0 -sandboxes 0 -e2e-for 0 -only unary -pipe -relay $m 2>&1;
      echo "# $(date -u +%T) uptime: $(uptime)"; } > $out
  done
done
echo done
