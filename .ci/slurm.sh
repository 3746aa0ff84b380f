#!/usr/bin/env bash
# A two-node SLURM cluster for CI on one host, without systemd, that looks like a real one: the
# submitting side (this shell, the "login node") has no GPU, and the compute nodes have GPUs that
# only jobs see. `.ci/slurm.sh start` installs the Debian packages if missing and writes
# slurm.conf and gres.conf: nodes ci1 and ci2 (one slurmd each, on ports of their own), each
# with two fake GPUs backed by /dev/null, of types a100 and h100, and a partition of each type
# beside the default `ci`, so that a run with two platforms sends each one's cells to its own
# partition. A task prolog puts a fake `nvidia-smi` on the PATH of every job step (and nowhere
# else): it lists the job's GPUs (CUDA_VISIBLE_DEVICES, from gres.conf) by their type's NVML
# name and reports driver PTSPEED_FAKE_DRIVER (default 535.104.05). It starts munged, slurmctld
# and the slurmds and waits until both nodes are idle; `.ci/slurm.sh stop` cancels the jobs left
# and stops the daemons. Both are idempotent; every wait is bounded.
# Needs root (packages, /etc/slurm, daemons). The cluster keeps no accounting database
# (no slurmdbd), so Snakemake must query job states with `--slurm-status-command squeue`.
set -euo pipefail

STATE=${PTSPEED_SLURM_STATE:-/var/lib/ptspeed-slurm}
CONF_DIR=/etc/slurm
MARKER="# written by ptspeed .ci/slurm.sh"
NODES=(ci1 ci2)
FIRST_SLURMD_PORT=6818
# One fake GPU of each type per node; each type is also a partition (tests/test_slurm.py's
# platforms), and NVML's name of it is what the fake nvidia-smi prints.
FAKE_GPU_TYPES=(a100 h100)
declare -A FAKE_GPU_NAMES=([a100]="NVIDIA A100-SXM4-80GB" [h100]="NVIDIA H100 80GB HBM3")
FAKE_DRIVER=${PTSPEED_FAKE_DRIVER:-535.104.05}
WAIT_S=${PTSPEED_SLURM_WAIT_S:-60}

say() { echo "slurm.sh: $*" >&2; }
die() { say "$*"; exit 1; }

install_packages() {
    bash "$(dirname "${BASH_SOURCE[0]}")/packages.sh" slurm
}

node_memory_mb() {
    # 90 % of the machine, shared by the nodes: slurmd drains a node that has less memory than
    # configured.
    awk -v nodes=${#NODES[@]} '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.9 / nodes }' /proc/meminfo
}

node_gres() {
    local type gres=()
    for type in "${FAKE_GPU_TYPES[@]}"; do gres+=("gpu:$type:1"); done
    (IFS=,; echo "${gres[*]}")
}

write_config() {
    local host=$1
    if [ -f "$CONF_DIR/slurm.conf" ] && ! grep -qF "$MARKER" "$CONF_DIR/slurm.conf"; then
        die "$CONF_DIR/slurm.conf exists and was not written by this script; not touching it"
    fi
    mkdir -p "$CONF_DIR" "$STATE/ctld" "$STATE/log" "$STATE/run" "$STATE/dev" "$STATE/gpu-bin"
    cat >"$CONF_DIR/slurm.conf" <<EOF
$MARKER: a two-node CI cluster on one host.
ClusterName=ptspeed-ci
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d-%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
# No cgroups in CI containers: track processes by their parent, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TaskProlog=$STATE/task-prolog.sh
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
EOF
    local type node port=$FIRST_SLURMD_PORT
    for node in "${NODES[@]}"; do
        echo "NodeName=$node NodeHostname=$host NodeAddr=127.0.0.1 Port=$port CPUs=$(nproc)" \
            "RealMemory=$(node_memory_mb) Gres=$(node_gres) State=UNKNOWN"
        port=$((port + 1))
    done >>"$CONF_DIR/slurm.conf"
    echo "PartitionName=ci Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$CONF_DIR/slurm.conf"
    for type in "${FAKE_GPU_TYPES[@]}"; do
        echo "PartitionName=$type Nodes=ALL MaxTime=INFINITE State=UP" >>"$CONF_DIR/slurm.conf"
    done
    # Fake GPUs: one name per device (slurmd rejects a file named twice), each /dev/null.
    {
        echo "$MARKER: fake GPUs, so that GPU requests can be scheduled; no device behind them."
        for node in "${NODES[@]}"; do
            for type in "${FAKE_GPU_TYPES[@]}"; do
                ln -sfn /dev/null "$STATE/dev/fake-gpu-$node-$type"
                echo "NodeName=$node Name=gpu Type=$type File=$STATE/dev/fake-gpu-$node-$type"
            done
        done
    } >"$CONF_DIR/gres.conf"
    write_fake_nvidia_smi
}

write_fake_nvidia_smi() {
    # The task prolog runs in each job step's environment; what it prints as `export` is set
    # there, so that only jobs find the fake nvidia-smi.
    cat >"$STATE/task-prolog.sh" <<EOF
#!/bin/sh
echo "export PATH=$STATE/gpu-bin:\$PATH"
EOF
    local names="" type
    for type in "${FAKE_GPU_TYPES[@]}"; do names+="${names:+|}${FAKE_GPU_NAMES[$type]}"; done
    cat >"$STATE/gpu-bin/nvidia-smi" <<EOF
#!/bin/bash
# The fake nvidia-smi of .ci/slurm.sh: the job's GPUs, by their index in gres.conf's order
# ($names), and driver $FAKE_DRIVER.
IFS='|' read -r -a names <<<"$names"
IFS=, read -r -a gpus <<<"\${CUDA_VISIBLE_DEVICES:-}"
if [ \${#gpus[@]} -eq 0 ]; then echo "No devices were found"; exit 6; fi
case "\$*" in
    -L) for i in "\${!gpus[@]}"; do
            echo "GPU \$i: \${names[\${gpus[\$i]}]} (UUID: GPU-fake-\$SLURMD_NODENAME-\${gpus[\$i]})"
        done ;;
    *driver_version*) for _ in "\${gpus[@]}"; do echo "$FAKE_DRIVER"; done ;;
    *) echo "fake nvidia-smi: \$* is not faked" >&2; exit 2 ;;
esac
EOF
    chmod 0755 "$STATE/task-prolog.sh" "$STATE/gpu-bin/nvidia-smi"
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

node_states() { timeout 10 sinfo --noheader --Node --format='%N %t' 2>/dev/null | sort -u; }

wait_for_nodes() {
    local deadline=$((SECONDS + WAIT_S)) states="" ready node state
    while [ $SECONDS -lt $deadline ]; do
        states=$(node_states)
        ready=0
        while read -r node state; do
            case $state in
                idle | mix | alloc) ready=$((ready + 1)) ;;
                down* | drain* | drng*) timeout 10 scontrol update NodeName="$node" State=RESUME || true ;;
            esac
        done <<<"$states"
        if [ "$ready" -eq ${#NODES[@]} ]; then
            say "nodes ready: $(echo "$states" | tr '\n' ' ')"
            return
        fi
        sleep 1
    done
    die "nodes not ready after ${WAIT_S}s: $(echo "$states" | tr '\n' ' ')(see $STATE/log/)"
}

start() {
    [ "$(id -u)" -eq 0 ] || die "start needs root (packages, $CONF_DIR, daemons)"
    install_packages
    write_config "$(hostname -s)"
    start_munge
    pid_alive "$STATE/run/slurmctld.pid" || slurmctld
    timeout "$WAIT_S" bash -c 'until scontrol ping 2>/dev/null | grep -q UP; do sleep 0.5; done' \
        || die "slurmctld did not come up within ${WAIT_S}s (see $STATE/log/slurmctld.log)"
    local node
    for node in "${NODES[@]}"; do
        pid_alive "$STATE/run/slurmd-$node.pid" || slurmd -N "$node"
    done
    wait_for_nodes
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
    local node
    for node in "${NODES[@]}"; do
        stop_daemon "$STATE/run/slurmd-$node.pid" "slurmd $node"
    done
    stop_daemon "$STATE/run/slurmd.pid" slurmd # the one node of an earlier version of this script
    stop_daemon "$STATE/run/slurmctld.pid" slurmctld
    stop_daemon /run/munge/munged.pid munged
    say "stopped"
}

case ${1:-} in
    start) start ;;
    stop) stop ;;
    *) die "usage: $0 start|stop" ;;
esac
