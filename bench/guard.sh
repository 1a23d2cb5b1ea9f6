#!/bin/bash
# guard.sh LIMIT_GIB -- command...   Run a command; SIGKILL its whole process tree once the tree's RSS
# exceeds LIMIT_GIB (polled every 0.5 s); print the largest RSS seen. A cgroup-less memory guard
# (prlimit --as counts reserved address space, which DuckDB and jemalloc inflate far beyond RSS).
limit_kb=$(( $1 * 1048576 )); shift
[ "$1" = "--" ] && shift
setsid "$@" &
pid=$!
max=0
tree_rss() { ps -eo pid=,ppid=,rss= | awk -v root="$1" '{p[$1]=$2; r[$1]=$3} END {
  for (x in p) { y=x; while (y && y!=root && y in p) y=p[y]; if (y==root) s+=r[x] } print s+0 }'; }
while kill -0 $pid 2>/dev/null; do
  now=$(tree_rss $pid)
  [ "$now" -gt "$max" ] && max=$now
  if [ "$now" -gt "$limit_kb" ]; then
    echo "guard: RSS ${now} kB > ${limit_kb} kB: killing the run" >&2
    kill -KILL -- -$pid
  fi
  sleep 0.5
done
wait $pid; rc=$?
echo "guard: largest RSS seen $((max / 1024)) MiB; exit $rc" >&2
exit $rc
