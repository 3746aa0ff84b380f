#!/usr/bin/env bash
# A one-node SLURM cluster for CI, without systemd: `.ci/slurm.sh start` installs the Debian
# packages if missing, writes slurm.conf and gres.conf (two fake GPUs backed by /dev/null, of
# types a100 and h100, and a partition of each name beside the default `ci`, so that a run with
# two platforms sends each one's cells to its own partition),
# starts munged, slurmctld and slurmd and waits until the node is idle; `.ci/slurm.sh stop`
# cancels the jobs left and stops the daemons. Both are idempotent; every wait is bounded.
# Needs root (packages, /etc/slurm, daemons). The cluster keeps no accounting database
# (no slurmdbd), so Snakemake must query job states with `--slurm-status-command squeue`.
set -euo pipefail

STATE=${PTSPEED_SLURM_STATE:-/var/lib/ptspeed-slurm}
CONF_DIR=/etc/slurm
MARKER="# written by ptspeed .ci/slurm.sh"
# One fake GPU of each type; each type is also a partition (tests/test_slurm.py's platforms).
FAKE_GPU_TYPES=(a100 h100)
WAIT_S=${PTSPEED_SLURM_WAIT_S:-60}

say() { echo "slurm.sh: $*" >&2; }
die() { say "$*"; exit 1; }

install_packages() {
    bash "$(dirname "${BASH_SOURCE[0]}")/packages.sh" slurm
}

real_memory_mb() {
    # 90 % of the machine: slurmd drains a node that has less memory than configured.
    awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo
}

write_config() {
    local host=$1
    if [ -f "$CONF_DIR/slurm.conf" ] && ! grep -qF "$MARKER" "$CONF_DIR/slurm.conf"; then
        die "$CONF_DIR/slurm.conf exists and was not written by this script; not touching it"
    fi
    mkdir -p "$CONF_DIR" "$STATE/ctld" "$STATE/d" "$STATE/log" "$STATE/run"
    cat >"$CONF_DIR/slurm.conf" <<EOF
$MARKER: a single-node CI cluster.
ClusterName=ptspeed-ci
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
# No cgroups in CI containers: track processes by their parent, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
MpiDefault=none
ReturnToService=2
# Finished jobs stay visible to squeue for 5 minutes: Snakemake's status queries need that.
MinJobAge=300
SchedulerParameters=sched_interval=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$(real_memory_mb) Gres=$(node_gres) State=UNKNOWN
PartitionName=ci Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    for type in "${FAKE_GPU_TYPES[@]}"; do
        echo "PartitionName=$type Nodes=ALL MaxTime=INFINITE State=UP" >>"$CONF_DIR/slurm.conf"
    done
    # Fake GPUs: one name per device (slurmd rejects a file named twice), each /dev/null.
    mkdir -p "$STATE/dev"
    {
        echo "$MARKER: fake GPUs, so that GPU requests can be scheduled; no device behind them."
        local index=0 type
        for type in "${FAKE_GPU_TYPES[@]}"; do
            ln -sfn /dev/null "$STATE/dev/fake-gpu$index"
            echo "NodeName=$host Name=gpu Type=$type File=$STATE/dev/fake-gpu$index"
            index=$((index + 1))
        done
    } >"$CONF_DIR/gres.conf"
}

node_gres() {
    local type gres=()
    for type in "${FAKE_GPU_TYPES[@]}"; do gres+=("gpu:$type:1"); done
    (IFS=,; echo "${gres[*]}")
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_munge() {
    if timeout 5 munge -n </dev/null 2>/dev/null | timeout 5 unmunge >/dev/null 2>&1; then
        return
    fi
    [ -f /etc/munge/munge.key ] || timeout 30 mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
    runuser -u munge -- munged
    timeout "$WAIT_S" bash -c 'until munge -n </dev/null | unmunge >/dev/null 2>&1; do sleep 0.5; done' \
        || die "munged did not answer within ${WAIT_S}s"
}

node_state() { timeout 10 sinfo --noheader --Node --format=%t 2>/dev/null | head -1; }

start() {
    [ "$(id -u)" -eq 0 ] || die "start needs root (packages, $CONF_DIR, daemons)"
    install_packages
    local host
    host=$(hostname -s)
    write_config "$host"
    start_munge
    pid_alive "$STATE/run/slurmctld.pid" || slurmctld
    timeout "$WAIT_S" bash -c 'until scontrol ping 2>/dev/null | grep -q UP; do sleep 0.5; done' \
        || die "slurmctld did not come up within ${WAIT_S}s (see $STATE/log/slurmctld.log)"
    pid_alive "$STATE/run/slurmd.pid" || slurmd
    local deadline=$((SECONDS + WAIT_S)) state=""
    while [ $SECONDS -lt $deadline ]; do
        state=$(node_state)
        case $state in
            idle | mix | alloc) say "node $host is $state"; return ;;
            down* | drain* | drng*) timeout 10 scontrol update NodeName="$host" State=RESUME || true ;;
        esac
        sleep 1
    done
    die "node $host is '${state:-unknown}' after ${WAIT_S}s (see $STATE/log/slurmd.log)"
}

stop_daemon() {
    local pid_file=$1 name=$2
    pid_alive "$pid_file" || return 0
    local pid
    pid=$(cat "$pid_file")
    kill "$pid"
    timeout "$WAIT_S" bash -c "while kill -0 $pid 2>/dev/null; do sleep 0.5; done" \
        || { say "$name ($pid) ignored TERM; killing it"; kill -9 "$pid" 2>/dev/null || true; }
}

stop() {
    if command -v squeue >/dev/null && pid_alive "$STATE/run/slurmctld.pid"; then
        timeout 10 squeue --noheader --format=%i | xargs -r timeout 10 scancel || true
    fi
    stop_daemon "$STATE/run/slurmd.pid" slurmd
    stop_daemon "$STATE/run/slurmctld.pid" slurmctld
    stop_daemon /run/munge/munged.pid munged
    say "stopped"
}

case ${1:-} in
    start) start ;;
    stop) stop ;;
    *) die "usage: $0 start|stop" ;;
esac
