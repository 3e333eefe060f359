#!/usr/bin/env bash
# A real one-node SLURM cluster on localhost (Debian's slurm-wlm and munge), for the `slurm` tests.
#
#   scripts/slurm-localhost.sh start DIR   # writes DIR/slurm.conf, starts munged, slurmctld, slurmd; waits for the node
#   scripts/slurm-localhost.sh stop DIR    # stops the three daemons started in DIR
#
# Everything lives in DIR: config, state, spool, logs, the munge socket and key; the ports are free ones, so
# several clusters can run side by side on one machine. Commands reach the cluster with SLURM_CONF=DIR/slurm.conf.
# Needs root (slurmd runs jobs as their user) and `apt-get install slurm-wlm munge`.
set -euo pipefail
cmd=${1:?usage: $0 start|stop DIR}
dir=$(realpath -m "${2:?usage: $0 start|stop DIR}")

stop() {
    for name in slurmd slurmctld munged; do
        pidfile="$dir/$name.pid"
        [[ -f $pidfile ]] || continue
        pid=$(cat "$pidfile")
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
        rm -f "$pidfile"
    done
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

start() {
    for prog in munged slurmctld slurmd sbatch; do
        command -v "$prog" >/dev/null || { echo "$0: $prog not found; apt-get install slurm-wlm munge" >&2; exit 2; }
    done
    mkdir -p "$dir"/{state,spool,log,munge}
    chmod 700 "$dir/munge"
    [[ -f $dir/munge/munge.key ]] || { dd if=/dev/urandom bs=1 count=1024 of="$dir/munge/munge.key" 2>/dev/null; chmod 400 "$dir/munge/munge.key"; }
    munged --force --socket="$dir/munge/munge.sock" --key-file="$dir/munge/munge.key" \
        --pid-file="$dir/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed"
    local cpus=${SLURM_LOCAL_CPUS:-2} node=${SLURM_LOCAL_NODE:-smallinit-$(basename "$dir")}
    cat >"$dir/slurm.conf" <<EOF
ClusterName=smallinit-local
SlurmctldHost=localhost
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job waits this long before it may start again (default 120 s)
AuthInfo=socket=$dir/munge/munge.sock,cred_expire=5
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
SchedulerType=sched/backfill
KillWait=30
MinJobAge=600
InactiveLimit=0
NodeName=$node NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=2000 State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
    export SLURM_CONF=$dir/slurm.conf
    slurmctld -f "$SLURM_CONF"
    slurmd -f "$SLURM_CONF" -N "$node"
    for _ in $(seq 100); do
        if sinfo -h -N -o '%T' 2>/dev/null | grep -qx idle; then
            echo "SLURM_CONF=$SLURM_CONF"
            return 0
        fi
        sleep 0.2
    done
    echo "$0: the node did not come up; see $dir/log" >&2
    stop
    exit 1
}

case $cmd in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
