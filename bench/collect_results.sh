#!/usr/bin/env bash
# Files the logs of one device run (bench/collectives_run.sh, extracted from its collectives-logs.tgz) into bench/results:
# the named logs concatenated, as printed, into <date>-<kind>-<what>.txt, and each log's JSON beside it as
# <date>-<kind>-<what>-<log>.json.
#   bench/collect_results.sh LOG_DIR KIND WHAT "NOTE" LOG...      (LOG: a log's name without .txt)
set -euo pipefail
dir=$1 kind=$2 what=$3 note=$4; shift 4
results=$(cd "$(dirname "$0")" && pwd)/results
date=$(date -u +%Y-%m-%d)
text="$results/$date-$kind-$what.txt"
{
  echo "# $note"
  cat "$dir/header.txt"
  for log in "$@"; do echo; echo "### $log.txt"; cat "$dir/$log.txt"; done
} > "$text"
for log in "$@"; do
  if [ -f "$dir/$log.json" ]; then cp "$dir/$log.json" "$results/$date-$kind-$what-$log.json"; chmod u+w "$results/$date-$kind-$what-$log.json"; fi
done
echo "$text"
