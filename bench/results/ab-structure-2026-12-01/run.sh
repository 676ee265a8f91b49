#!/bin/bash
# A/B of the #11 refactor: before = dc1d040 (worktree $BEFORE), after = HEAD ($AFTER), alternating.
set -u
B=$BEFORE; A=$AFTER; PY=$AFTER/.venv/bin/python
PP_B="$B/shared/src:$B/services/collector/src:$B/services/picker/src:$B/services/simulator/src:$B/tools/devstack/src:$B/tools/quality/src"
for round in 1 2; do
  for side in before after; do
    if [ $side = before ]; then dir=$B; pp=$PP_B; else dir=$A; pp=""; fi
    echo "== $(date +%T) collector $side round $round load $(cut -d' ' -f1-3 /proc/loadavg)"
    (cd $dir && PYTHONPATH=$pp timeout 900 $PY bench/collector.py --output /tmp/ab/collector-$side-$round.json > /tmp/ab/collector-$side-$round.log 2>&1; echo "rc $?")
  done
done
for round in 1 2; do
  for side in before after; do
    if [ $side = before ]; then dir=$B; pp=$PP_B; else dir=$A; pp=""; fi
    echo "== $(date +%T) picker $side round $round load $(cut -d' ' -f1-3 /proc/loadavg)"
    (cd $dir && PATH=$AFTER/.venv/bin:$PATH PYTHONPATH=$pp timeout 1800 $PY bench/picker.py --output /tmp/ab/picker-$side-$round.json > /tmp/ab/picker-$side-$round.log 2>&1; echo "rc $?")
  done
done
echo "== done $(date +%T)"
