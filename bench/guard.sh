#!/bin/bash
# guard.sh LIMIT_GIB -- command...   Run a command; SIGKILL its whole process tree once the tree's
# anonymous RSS (RssAnon in /proc/PID/status: heap, not file-backed pages) exceeds LIMIT_GIB (polled
# every 0.5 s); print the largest anonymous and total RSS seen. A cgroup-less memory guard: prlimit
# --as counts reserved address space, which DuckDB and jemalloc inflate far beyond RSS, and total RSS
# counts the pages of spilled runs (storage/spill.py), which the kernel evicts under pressure.
limit_kb=$(( $1 * 1048576 )); shift
[ "$1" = "--" ] && shift
setsid "$@" &
pid=$!
max_anon=0
max_rss=0
# "anon total" of the tree rooted at $1 (kB)
tree_rss() {
  local pids
  pids=$(ps -eo pid=,ppid= | awk -v root="$1" '{p[$1]=$2} END {
    for (x in p) { y=x; while (y && y!=root && y in p) y=p[y]; if (y==root) print x } }')
  [ -z "$pids" ] && { echo "0 0"; return; }
  (cd /proc && cat $(printf '%s/status ' $pids) 2>/dev/null) |
    awk '/^RssAnon:/ {a+=$2} /^VmRSS:/ {r+=$2} END {print a+0, r+0}'
}
while kill -0 $pid 2>/dev/null; do
  read -r anon total < <(tree_rss $pid)
  [ "$anon" -gt "$max_anon" ] && max_anon=$anon
  [ "$total" -gt "$max_rss" ] && max_rss=$total
  if [ "$anon" -gt "$limit_kb" ]; then
    echo "guard: anonymous RSS ${anon} kB > ${limit_kb} kB: killing the run" >&2
    kill -KILL -- -$pid
  fi
  sleep 0.5
done
wait $pid; rc=$?
echo "guard: largest anonymous RSS seen $((max_anon / 1024)) MiB, largest RSS $((max_rss / 1024)) MiB; exit $rc" >&2
exit $rc
