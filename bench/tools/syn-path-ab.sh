#!/bin/bash
# syn-path-ab.sh OLD_POLICER NEW_POLICER [ROUNDS] [CALLS]
#
# The SYN path of two policer builds side by side (docs/performance.md,
# "2026-11-30 (late)"): each build's daemon in a namespace of its own
# (pbsyn1, pbsyn2) with a kernel TCP listener, `--syn-cookies always` on
# 0.0.0.0/0 tcp; then bursts of CALLS test runs (BPF_PROG_TEST_RUN, one SYN
# each, from 8 192 sources in turn) alternated between the two attached
# programs, ROUNDS times, the program's own time per run read from the
# kernel's BPF statistics. Bursts of a fraction of a second alternated:
# what the host's load does to one build it does to the other (an A/A run
# reads 0.99, 0.94-1.22 per round). Caches are colder than under a live
# flood (a system call and the interpreter between two SYNs): it compares
# builds, it does not give the SYN path's cost in a flood (`policer-bench
# --only syn` does). Root; the namespaces are removed at the end.
# SETTLE=SECONDS waits that long after the rules are set before the first
# round: 121 measures what a flood meets after the SYN path's first two
# minutes (policer_common::syn::EXACT_NS: until then each SYN's listener
# is looked up by the SYN's own tuple).
set -eu
OLD=$1; NEW=$2; ROUNDS=${3:-30}; CALLS=${4:-3000}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d /tmp/syn-path-ab.XXXXXX)
cleanup() {
  for n in 1 2; do
    [ -f "$WORK/d$n.pid" ] && kill -INT "$(cat "$WORK/d$n.pid")" 2>/dev/null || true
  done
  sleep 1
  for n in 1 2; do
    [ -f "$WORK/l$n.pid" ] && kill "$(cat "$WORK/l$n.pid")" 2>/dev/null || true
    ip netns del pbsyn$n 2>/dev/null || true
  done
  sysctl -qw kernel.bpf_stats_enabled=0
  rm -rf "$WORK"
}
trap cleanup EXIT
for n in 1 2; do
  B=$OLD; [ $n = 2 ] && B=$NEW
  ip netns add pbsyn$n
  ip -n pbsyn$n link set lo up
  ip -n pbsyn$n link add va type veth peer name vb
  ip -n pbsyn$n addr add 10.99.0.1/24 dev va
  ip -n pbsyn$n link set va up
  ip -n pbsyn$n link set vb up
  ip netns exec pbsyn$n sysctl -qw net.ipv4.tcp_syncookies=2 net.ipv4.tcp_timestamps=2
  ip netns exec pbsyn$n python3 -c "
import socket, time
s = socket.socket(); s.bind(('10.99.0.1', 8080)); s.listen(1024); time.sleep(1e6)" &
  echo $! > "$WORK/l$n.pid"
  mkdir -p "$WORK/state$n"
  ip netns exec pbsyn$n "$B" attach va --config "$WORK/p$n.toml" --rate 100kpps --burst 1000 --mode native \
    --state-dir "$WORK/state$n" > "$WORK/daemon$n.log" 2>&1 &
  echo $! > "$WORK/d$n.pid"
  for _ in $(seq 100); do grep -q policing "$WORK/daemon$n.log" && break; sleep 0.2; done
  if ! grep -q policing "$WORK/daemon$n.log"; then
    echo "syn-path-ab: $B did not start in pbsyn$n:" >&2
    cat "$WORK/daemon$n.log" >&2
    exit 1
  fi
  ip netns exec pbsyn$n "$B" rule set 0.0.0.0/0 --proto tcp --rate 20kpps --syn-cookies always > /dev/null
done
sleep "${SETTLE:-0}"
id_of() { ip netns exec "$1" bpftool net show dev va | grep -o "id [0-9]*" | head -1 | cut -d' ' -f2; }
sysctl -qw kernel.bpf_stats_enabled=1
python3 "$HERE/syn_test_run.py" "$ROUNDS" "$CALLS" "pbsyn1:$(id_of pbsyn1)" "pbsyn2:$(id_of pbsyn2)"
