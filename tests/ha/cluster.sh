#!/usr/bin/env bash
# A real highly available PostgreSQL 15 cluster on this machine for failover
# tests: etcd plus three Patroni nodes (pg1, pg2, pg3), rendered from
# deploy/patroni/patroni.yml. See tests/ha/README.md.
#
# It never touches the PostgreSQL server on port 5432: every process it starts
# or stops belongs to $HA_DIR (default <repo>/target/ha) and its own ports.
#
# stdout carries only the documented one-line answers; progress and errors go
# to stderr, process output to $HA_DIR/logs.
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd -- "$SCRIPT_DIR/../.." && pwd)
HA_DIR=${HA_DIR:-$REPO/target/ha}
case $HA_DIR in /*) ;; *) HA_DIR=$PWD/$HA_DIR ;; esac
HA_DIR=${HA_DIR%/}
TEMPLATE=$REPO/deploy/patroni/patroni.yml
HAPROXY_CFG=$REPO/deploy/haproxy/haproxy.cfg
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
UP_TIMEOUT=${UP_TIMEOUT:-60}
FAULT_TIMEOUT=${FAULT_TIMEOUT:-60}

HOST=127.0.0.1
# HA_PORT_OFFSET moves every port (HAProxy's example is then run with its ports moved too),
# so that a second cluster, with its own HA_DIR, can run beside the first.
OFF=${HA_PORT_OFFSET:-0}
ETCD_CLIENT_PORT=$((23790 + OFF))
ETCD_PEER_PORT=$((23800 + OFF))
HAPROXY_PORT=$((55430 + OFF))
(( OFF == 0 )) || HAPROXY_CFG=$HA_DIR/haproxy-moved.cfg
NODES=(pg1 pg2 pg3)
PG_PORTS=($((55431 + OFF)) $((55432 + OFF)) $((55433 + OFF)))
API_PORTS=($((58001 + OFF)) $((58002 + OFF)) $((58003 + OFF)))
URL="postgres://postgres@$HOST:${PG_PORTS[0]},$HOST:${PG_PORTS[1]},$HOST:${PG_PORTS[2]}/postgres?target_session_attrs=read-write"

# The Unix socket path must stay under the kernel's 107-byte limit; a deep
# $HA_DIR falls back to a short directory in /tmp named after it.
RUN_DIR=$HA_DIR/run
if (( ${#RUN_DIR} > 80 )); then
    RUN_DIR=/tmp/settled-ha-$(printf '%s' "$HA_DIR" | cksum | cut -d' ' -f1)
fi

PY=/usr/bin/python3
[[ -x $PY ]] || PY=$(command -v python3 || true)

log() { printf 'cluster.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# --- small helpers -----------------------------------------------------------

node_index() {
    local i
    for i in 0 1 2; do [[ ${NODES[i]} == "$1" ]] && { echo "$i"; return 0; }; done
    return 1
}
pg_port_of() { echo "${PG_PORTS[$(node_index "$1")]}"; }
data_dir_of() { echo "$HA_DIR/$1/data"; }

# Runs a command as the postgres user when we are root (PostgreSQL refuses to
# run as root); as ourselves otherwise. exec-style: no extra process.
as_pg() {
    if (( EUID == 0 )); then
        setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"
    else
        "$@"
    fi
}

# psql against one node over TCP; -A -t output.
q() {
    local port=$1
    shift
    PGCONNECT_TIMEOUT=3 PGOPTIONS="-c statement_timeout=10000 ${Q_PGOPTIONS:-}" \
        psql -X -q -v ON_ERROR_STOP=1 -h "$HOST" -p "$port" -U postgres -d postgres -At "$@" </dev/null
}

cmdline() { tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline" || true; }

# pid alive and its command line mentions $2 (guards against pid reuse).
pid_matches() {
    [[ -n ${1:-} && -d /proc/$1 ]] || return 1
    [[ $(cmdline "$1") == *"$2"* ]]
}

proc_state() { sed -e 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1; }

patroni_pid() {
    local pid
    pid=$(cat "$HA_DIR/$1.pid" 2>/dev/null) || return 1
    pid_matches "$pid" "$HA_DIR/$1.yml" || return 1
    echo "$pid"
}

postmaster_pid() {
    local dd pid
    dd=$(data_dir_of "$1")
    pid=$(head -n1 "$dd/postmaster.pid" 2>/dev/null) || return 1
    pid_matches "$pid" "$dd" || return 1
    echo "$pid"
}

is_frozen() {
    local pid
    pid=$(patroni_pid "$1") || return 1
    [[ $(proc_state "$pid") == T ]]
}

children_of() {
    awk -v parent="$1" '{ sub(/^.*\) /, ""); if ($2 == parent) { split(FILENAME, f, "/"); print f[3] } }' \
        /proc/[0-9]*/stat 2>/dev/null || true
}

# Starts "$@" detached (own session, stdin /dev/null, output to $2) and writes
# its pid to $1. The pid is that of the final program (exec all the way).
spawn() {
    local pidfile=$1 logfile=$2
    shift 2
    rm -f "$pidfile"
    setsid bash -c 'echo $$ >"$0"; exec "$@"' "$pidfile" "$@" </dev/null >>"$logfile" 2>&1 &
    local i
    for i in $(seq 50); do [[ -s $pidfile ]] && return 0; sleep 0.1; done
    die "could not start $1"
}

port_in_use() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

mode() { cat "$HA_DIR/mode" 2>/dev/null || echo sync; }

# The cluster as Patroni sees it, one member per line:
#   name role state pg_port timeline
# role is leader, sync_standby or replica. Asks the REST API of the first node
# that answers, skipping frozen (SIGSTOPped) ones.
members() {
    local i json
    for i in 0 1 2; do
        is_frozen "${NODES[i]}" && continue
        json=$(curl -fsS --max-time 2 "http://$HOST:${API_PORTS[i]}/cluster" 2>/dev/null) || continue
        "$PY" -c '
import json, sys
for m in json.load(sys.stdin).get("members", []):
    print(m["name"], m.get("role", "?"), m.get("state", "?") or "?", m.get("port", 0), m.get("timeline", 0))
' <<<"$json" && return 0
    done
    return 1
}

# "name port" of the running leader; fails if there is none.
leader() {
    local lines
    lines=$(members) || return 1
    awk '$2 == "leader" && $3 == "running" { print $1, $4; found = 1 } END { exit !found }' <<<"$lines"
}

patronictl_() {
    local cfg
    for cfg in "$HA_DIR"/pg1.yml "$HA_DIR"/pg2.yml "$HA_DIR"/pg3.yml; do
        [[ -f $cfg ]] && { patronictl -c "$cfg" "$@"; return; }
    done
    die "no cluster configuration under $HA_DIR (run: $0 up)"
}

tail_logs() {
    local f
    for f in "$HA_DIR"/logs/*.log; do
        [[ -f $f ]] || continue
        printf '\n===== tail %s =====\n' "$f" >&2
        tail -n "${1:-25}" "$f" >&2
    done
}

# --- health ------------------------------------------------------------------

HEALTH_MSG=
# A running leader that is writable, all three members running, both standbys
# streaming from the leader and, in sync mode, one of them synchronous.
check_healthy() {
    local lines lead lport n rec streaming sync ssn ro
    if ! lines=$(members); then HEALTH_MSG="no Patroni REST API answers"; return 1; fi
    if ! lead=$(awk '$2 == "leader" && $3 == "running" { print $1, $4 }' <<<"$lines") || [[ -z $lead ]]; then
        HEALTH_MSG="no running leader: $(tr '\n' ';' <<<"$lines")"
        return 1
    fi
    n=$(awk '$3 == "running"' <<<"$lines" | wc -l)
    if (( n != 3 )); then HEALTH_MSG="$n of 3 members running: $(tr '\n' ';' <<<"$lines")"; return 1; fi
    lport=${lead#* }
    if ! IFS='|' read -r rec streaming sync ssn ro < <(q "$lport" -c "select pg_is_in_recovery(),
            (select count(*) from pg_stat_replication where state = 'streaming'),
            (select count(*) from pg_stat_replication where sync_state = 'sync'),
            current_setting('synchronous_standby_names'),
            current_setting('default_transaction_read_only')" 2>/dev/null); then
        HEALTH_MSG="leader $lead does not answer"
        return 1
    fi
    if [[ $rec != f ]]; then HEALTH_MSG="leader $lead is still in recovery"; return 1; fi
    if [[ $ro != off ]]; then HEALTH_MSG="leader $lead is read-only (run: $0 thaw)"; return 1; fi
    if (( streaming != 2 )); then HEALTH_MSG="$streaming of 2 standbys streaming from $lead"; return 1; fi
    if [[ $(mode) == sync ]]; then
        if (( sync < 1 )) || [[ -z $ssn ]]; then
            HEALTH_MSG="no synchronous standby yet (synchronous_standby_names='$ssn')"
            return 1
        fi
        if ! awk '$2 == "sync_standby" { f = 1 } END { exit !f }' <<<"$lines"; then
            HEALTH_MSG="Patroni has not recorded a sync standby yet"
            return 1
        fi
    fi
    HEALTH_MSG=
    return 0
}

wait_healthy() {
    local timeout=$1 start
    start=$(now)
    while ! check_healthy; do
        if awk -v s="$start" -v t="$timeout" -v n="$(now)" 'BEGIN { exit !(n - s > t) }'; then
            log "not healthy after ${timeout}s: $HEALTH_MSG"
            return 1
        fi
        sleep 0.3
    done
    log "healthy after $(elapsed "$start")s"
}

# Waits until a running, writable-capable leader other than $1 exists; prints it.
wait_new_leader() {
    local old=$1 timeout=$2 start lead
    start=$(now)
    while :; do
        if lead=$(leader 2>/dev/null) && [[ ${lead% *} != "$old" ]] &&
            [[ $(q "${lead#* }" -c 'select pg_is_in_recovery()' 2>/dev/null) == f ]]; then
            log "new leader ${lead% *} after $(elapsed "$start")s"
            echo "$lead"
            return 0
        fi
        if awk -v s="$start" -v t="$timeout" -v n="$(now)" 'BEGIN { exit !(n - s > t) }'; then
            log "no new leader after ${timeout}s"
            patronictl_ list >&2 || true
            return 1
        fi
        sleep 0.2
    done
}

# --- up / down ---------------------------------------------------------------

# Patroni before 3.0.3 can overwrite another node's leader key through the
# etcd v3 API (see deploy/patroni/patroni.yml): use the v2 API there.
choose_etcd_api() {
    local v
    v=$(patroni --version 2>/dev/null | awk '{ print $NF }')
    [[ -n $v ]] || die "cannot tell the Patroni version"
    if [[ $(printf '%s\n%s\n' "$v" 3.0.3 | sort -V | head -n1) == 3.0.3 ]]; then
        ETCD_API=etcd3
    else
        ETCD_API=etcd
    fi
}

check_prereqs() {
    local c
    for c in patroni patronictl etcd curl psql setsid; do
        command -v "$c" >/dev/null || die "$c is not installed (Debian: patroni etcd-server curl postgresql-client-15)"
    done
    [[ -x $PG_BIN/postgres ]] || die "no PostgreSQL binaries in $PG_BIN (set PG_BIN)"
    [[ -n $PY && -x $PY ]] || die "python3 is not installed"
    [[ -f $TEMPLATE ]] || die "missing $TEMPLATE"
    if (( EUID == 0 )); then
        id postgres >/dev/null 2>&1 || die "user postgres does not exist (PostgreSQL refuses to run as root)"
        command -v setpriv >/dev/null || die "setpriv (util-linux) is not installed"
    fi
}

render() {
    local name=$1 i out sync=true
    i=$(node_index "$name")
    [[ $(mode) == async ]] && sync=false
    out=$HA_DIR/$name.yml
    sed -e "s|@NAME@|$name|g" \
        -e "s|@HOST@|$HOST|g" \
        -e "s|@PG_PORT@|${PG_PORTS[i]}|g" \
        -e "s|@API_PORT@|${API_PORTS[i]}|g" \
        -e "s|@DATA_DIR@|$(data_dir_of "$name")|g" \
        -e "s|@RUN_DIR@|$RUN_DIR|g" \
        -e "s|@BIN_DIR@|$PG_BIN|g" \
        -e "s|@ETCD_API@|$ETCD_API|g" \
        -e "s|@ETCD@|$HOST:$ETCD_CLIENT_PORT|g" \
        -e "s|@SYNC@|$sync|g" \
        "$TEMPLATE" >"$out"
    if grep -n '@[A-Z_]*@' "$out" | grep -v '^[0-9]*:[[:space:]]*#' >&2; then
        die "unsubstituted placeholder in $out"
    fi
    chmod 0644 "$out"
}

start_patroni() {
    local name=$1
    spawn "$HA_DIR/$name.pid" "$HA_DIR/logs/$name.log" \
        env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$RUN_DIR" LANG=C.UTF-8 LC_ALL=C.UTF-8 \
        "${SETPRIV[@]}" patroni "$HA_DIR/$name.yml"
}

# The cluster's ports lie in Linux's ephemeral range (32768-60999): a client
# connection of anything on the machine may take one as its local port between
# the check below and the bind, and a member then fails with "Address already
# in use". Reserved ports are never handed out that way; a process may still
# bind them. Added to the machine's list (root only; others go without).
reserve_ports() {
    local file=/proc/sys/net/ipv4/ip_local_reserved_ports have want
    [[ -w $file ]] || return 0
    have=$(<"$file")
    want="$HAPROXY_PORT-${PG_PORTS[2]},${API_PORTS[0]}-${API_PORTS[2]}"
    echo "${have:+$have,}$want" >"$file" 2>/dev/null || true
}

cmd_up() {
    local sync=sync start i name
    while (( $# )); do
        case $1 in
            --async) sync=async ;;
            *) die "up: unknown option $1" ;;
        esac
        shift
    done
    check_prereqs
    choose_etcd_api
    start=$(now)
    cmd_down
    reserve_ports
    for i in $ETCD_CLIENT_PORT $ETCD_PEER_PORT $HAPROXY_PORT "${PG_PORTS[@]}" "${API_PORTS[@]}"; do
        if port_in_use "$i"; then
            ss -ltnp 2>/dev/null | grep ":$i " >&2 || true
            die "port $i is in use by another process (another cluster under a different HA_DIR?)"
        fi
    done

    mkdir -p "$HA_DIR/logs" "$HA_DIR/etcd" "$RUN_DIR"
    chmod 0755 "$HA_DIR"
    echo "$sync" >"$HA_DIR/mode"
    SETPRIV=()
    if (( EUID == 0 )); then
        SETPRIV=(setpriv --reuid=postgres --regid=postgres --init-groups --)
        # User postgres must reach $HA_DIR: make every parent directory it
        # cannot search searchable (o+x: no listing, no writing).
        local d=$HA_DIR
        while [[ $d != / ]]; do
            d=$(dirname "$d")
            if ! as_pg test -x "$d"; then
                log "making $d searchable (chmod o+x) so that user postgres reaches $HA_DIR"
                chmod o+x "$d"
            fi
        done
        chown postgres: "$RUN_DIR"
    fi
    chmod 0755 "$RUN_DIR"
    for name in "${NODES[@]}"; do
        mkdir -p "$HA_DIR/$name"
        chmod 0700 "$HA_DIR/$name"
        (( EUID == 0 )) && chown postgres: "$HA_DIR/$name"
        render "$name"
    done
    if (( EUID == 0 )) && ! as_pg test -w "$RUN_DIR" -a -x "$HA_DIR/pg1"; then
        die "user postgres cannot write under $HA_DIR (a read-only or nosuid mount?); set HA_DIR elsewhere"
    fi

    log "starting etcd on $HOST:$ETCD_CLIENT_PORT (data in $HA_DIR/etcd; Patroni uses its $([[ $ETCD_API == etcd ]] && echo v2 || echo v3) API)"
    local v2=()
    [[ $ETCD_API == etcd ]] && v2=(--enable-v2=true)
    spawn "$HA_DIR/etcd.pid" "$HA_DIR/logs/etcd.log" \
        etcd "${v2[@]}" --name settled-ha --data-dir "$HA_DIR/etcd" \
        --listen-client-urls "http://$HOST:$ETCD_CLIENT_PORT" \
        --advertise-client-urls "http://$HOST:$ETCD_CLIENT_PORT" \
        --listen-peer-urls "http://$HOST:$ETCD_PEER_PORT" \
        --initial-advertise-peer-urls "http://$HOST:$ETCD_PEER_PORT" \
        --initial-cluster "settled-ha=http://$HOST:$ETCD_PEER_PORT" \
        --initial-cluster-token settled-ha --initial-cluster-state new
    for i in $(seq 100); do
        curl -fsS --max-time 1 "http://$HOST:$ETCD_CLIENT_PORT/health" 2>/dev/null | grep -q '"health":"true"' && break
        (( i == 100 )) && { tail_logs 40; die "etcd did not become healthy"; }
        sleep 0.1
    done

    log "starting Patroni nodes ${NODES[*]} ($sync replication)"
    for name in "${NODES[@]}"; do start_patroni "$name"; done

    if ! wait_healthy "$UP_TIMEOUT"; then
        patronictl_ list >&2 || true
        tail_logs 30
        die "cluster not healthy within ${UP_TIMEOUT}s ($HEALTH_MSG); logs in $HA_DIR/logs; run: $0 down"
    fi
    log "up in $(elapsed "$start")s; leader: $(leader)"
    echo "$URL"
}

# Kills pid (and, for a postmaster, its children) if it still mentions $2.
kill_tree() {
    local pid=$1 tag=$2 kids
    pid_matches "$pid" "$tag" || return 0
    kids=$(children_of "$pid")
    kill -CONT "$pid" 2>/dev/null || true
    kill -KILL "$pid" $kids 2>/dev/null || true
}

wait_gone() {
    local pid=$1 tag=$2 tenths=$3 i
    for ((i = 0; i < tenths; i++)); do
        pid_matches "$pid" "$tag" || return 0
        sleep 0.1
    done
    return 1
}

cmd_down() {
    local name pid dd kids pids=() tags=() i self
    cmd_haproxy_down >/dev/null
    # Patroni first (so that it does not restart PostgreSQL); everything is
    # thrown away afterwards, so it need not shut down gracefully.
    for name in "${NODES[@]}"; do
        if pid=$(patroni_pid "$name"); then
            kill -CONT "$pid" 2>/dev/null || true
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    # PostgreSQL: immediate shutdown (SIGQUIT), then SIGKILL of the postmaster
    # and its children as a last resort.
    for name in "${NODES[@]}"; do
        dd=$(data_dir_of "$name")
        if pid=$(postmaster_pid "$name"); then
            kids=$(children_of "$pid")
            kill -QUIT "$pid" 2>/dev/null || true
            pids+=("$pid")
            tags+=("$dd")
            for i in $kids; do pids+=("$i"); tags+=(""); done
        fi
    done
    if pid=$(cat "$HA_DIR/etcd.pid" 2>/dev/null) && pid_matches "$pid" "$HA_DIR/etcd"; then
        kill -TERM "$pid" 2>/dev/null || true
        pids+=("$pid")
        tags+=("$HA_DIR/etcd")
    fi
    for i in "${!pids[@]}"; do
        if [[ -n ${tags[i]} ]]; then
            wait_gone "${pids[i]}" "${tags[i]}" 50 || kill_tree "${pids[i]}" "${tags[i]}"
        else
            kill -KILL "${pids[i]}" 2>/dev/null || true
        fi
    done
    # Anything else still running from this directory (pg_basebackup,
    # pg_rewind, a postmaster whose pid file is gone, ...), except ourselves
    # and our ancestors.
    local ancestors=" $$ " p=$$
    while [[ $p -gt 1 ]]; do
        p=$(sed -e 's/^.*) //' "/proc/$p/stat" 2>/dev/null | cut -d' ' -f2) || break
        [[ -n $p ]] || break
        ancestors+="$p "
    done
    for self in 1 2 3; do
        local found=0
        for pid in $(ls /proc | grep -E '^[0-9]+$'); do
            [[ $ancestors == *" $pid "* ]] && continue
            local cl a0
            cl=$(cmdline "$pid")
            a0=${cl%% *}
            a0=${a0##*/}
            case $a0 in
                etcd | postgres | pg_ctl | pg_basebackup | pg_rewind | initdb | haproxy | patroni) ;;
                python3*) [[ $cl == *"/patroni "* ]] || continue ;;
                *) continue ;;
            esac
            case $cl in
                *"$HA_DIR/"* | *"$RUN_DIR/"* | *"$HAPROXY_CFG"*)
                    found=1
                    kids=$(children_of "$pid")
                    kill -CONT "$pid" 2>/dev/null || true
                    kill -KILL "$pid" $kids 2>/dev/null || true
                    ;;
            esac
        done
        (( found )) || break
        sleep 0.2
    done
    rm -rf "$HA_DIR"
    [[ $RUN_DIR == "$HA_DIR"/* ]] || rm -rf "$RUN_DIR"
    return 0
}

# --- faults ------------------------------------------------------------------

cmd_primary() {
    local lead
    lead=$(leader) || { log "no leader"; exit 1; }
    echo "$lead"
}

cmd_switchover() {
    local lead old cand lines new start
    start=$(now)
    lead=$(leader) || die "no leader"
    old=${lead% *}
    lines=$(members)
    if [[ $(mode) == sync ]]; then
        cand=$(awk '$2 == "sync_standby" && $3 == "running" { print $1; exit }' <<<"$lines")
    else
        cand=$(awk '$2 != "leader" && $3 == "running" { print $1; exit }' <<<"$lines")
    fi
    [[ -n $cand ]] || die "no healthy standby to switch over to: $(tr '\n' ';' <<<"$lines")"
    log "switchover $old -> $cand"
    patronictl_ switchover --leader "$old" --candidate "$cand" --force >&2
    new=$(wait_new_leader "$old" "$FAULT_TIMEOUT") || die "switchover did not complete"
    log "switchover took $(elapsed "$start")s"
    echo "$new"
}

cmd_kill_primary() {
    local lead name pid
    lead=$(leader) || die "no leader"
    name=${lead% *}
    pid=$(postmaster_pid "$name") || die "no postmaster for leader $name"
    kill -KILL "$pid"
    log "SIGKILLed postmaster $pid of leader $name"
    echo "$lead"
}

cmd_demote_in_place() {
    local lead name port pid new start
    start=$(now)
    lead=$(leader) || die "no leader"
    name=${lead% *}
    port=${lead#* }
    pid=$(patroni_pid "$name") || die "no Patroni process for $name"
    q "$port" -c 'ALTER SYSTEM SET default_transaction_read_only = on' -c 'SELECT pg_reload_conf()' >/dev/null
    kill -STOP "$pid"
    log "$name is read-only and its Patroni ($pid) frozen; waiting for the leader key to expire"
    new=$(wait_new_leader "$name" "$FAULT_TIMEOUT") || die "no standby took over from $name"
    log "demote-in-place took $(elapsed "$start")s"
    echo "$lead -> $new"
}

cmd_thaw() {
    local name i port dd pid
    for i in 0 1 2; do
        name=${NODES[i]}
        port=${PG_PORTS[i]}
        dd=$(data_dir_of "$name")
        if postmaster_pid "$name" >/dev/null &&
            [[ $(q "$port" -c "select count(*) from pg_file_settings where name = 'default_transaction_read_only'" 2>/dev/null) =~ ^[1-9] ]]; then
            Q_PGOPTIONS='-c default_transaction_read_only=off' \
                q "$port" -c 'ALTER SYSTEM RESET default_transaction_read_only' -c 'SELECT pg_reload_conf()' >/dev/null
            log "reset default_transaction_read_only on $name"
        elif [[ -f $dd/postgresql.auto.conf ]] && grep -q '^default_transaction_read_only' "$dd/postgresql.auto.conf"; then
            # PostgreSQL is not running: edit the file it will read on start.
            as_pg sed -i '/^default_transaction_read_only/d' "$dd/postgresql.auto.conf"
            log "removed default_transaction_read_only from $name's postgresql.auto.conf"
        fi
    done
    for name in "${NODES[@]}"; do
        if pid=$(patroni_pid "$name") && [[ $(proc_state "$pid") == T ]]; then
            kill -CONT "$pid"
            log "resumed Patroni of $name ($pid)"
        fi
    done
}

cmd_stop_standby() {
    local lines name port pid ppid
    lines=$(members) || die "no Patroni REST API answers"
    name=$(awk '$2 == "sync_standby" && $3 == "running" { print $1; exit }' <<<"$lines")
    [[ -n $name ]] || name=$(awk '$2 == "replica" && $3 == "running" { print $1; exit }' <<<"$lines")
    [[ -n $name ]] || die "no running standby: $(tr '\n' ';' <<<"$lines")"
    port=$(pg_port_of "$name")
    pid=$(patroni_pid "$name") || die "no Patroni process for $name"
    ppid=$(postmaster_pid "$name" || true)
    # A clean Patroni stop: it shuts PostgreSQL down, removes its member key
    # and stays down until start-standby.
    kill -TERM "$pid"
    if ! wait_gone "$pid" "$HA_DIR/$name.yml" 300; then
        log "Patroni of $name did not stop in 30s; killing it"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    if [[ -n $ppid ]] && ! wait_gone "$ppid" "$(data_dir_of "$name")" 100; then
        kill_tree "$ppid" "$(data_dir_of "$name")"
    fi
    echo "$name" >"$HA_DIR/stopped"
    log "stopped standby $name"
    echo "$name $port"
}

cmd_start_standby() {
    local name=${1:-}
    [[ -n $name ]] || name=$(cat "$HA_DIR/stopped" 2>/dev/null) || die "no standby was stopped"
    node_index "$name" >/dev/null || die "unknown member $name"
    patroni_pid "$name" >/dev/null && die "Patroni of $name is already running"
    SETPRIV=()
    (( EUID == 0 )) && SETPRIV=(setpriv --reuid=postgres --regid=postgres --init-groups --)
    start_patroni "$name"
    rm -f "$HA_DIR/stopped"
    log "started Patroni of $name"
    echo "$name $(pg_port_of "$name")"
}

cmd_wait_healthy() {
    local t=${1:-60}
    [[ $t =~ ^[0-9]+$ ]] || die "wait-healthy: SECONDS must be a number"
    if ! wait_healthy "$t"; then
        patronictl_ list >&2 || true
        exit 1
    fi
}

# --- haproxy -----------------------------------------------------------------

# "server status" lines of the settled_postgres proxy, from the stats socket.
haproxy_states() {
    "$PY" - "$RUN_DIR/haproxy.sock" <<'PYEOF'
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(2)
s.connect(sys.argv[1])
s.sendall(b"show stat\n")
data = b""
while True:
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
for line in data.decode().splitlines():
    f = line.split(",")
    if len(f) > 17 and f[0] == "settled_postgres" and f[1] not in ("FRONTEND", "BACKEND"):
        print(f[1], f[17])
PYEOF
}

cmd_haproxy_up() {
    local i r lead states ok
    command -v haproxy >/dev/null || die "haproxy is not installed"
    [[ -d $HA_DIR/logs ]] || die "no cluster under $HA_DIR (run: $0 up)"
    cmd_haproxy_down >/dev/null
    if (( OFF != 0 )); then
        # The example with every port moved as the cluster's are.
        local p e=()
        for p in 55430 55431 55432 55433 58001 58002 58003; do
            e+=(-e "s/\b$p\b/$((p + OFF))/g")
        done
        sed "${e[@]}" "$REPO/deploy/haproxy/haproxy.cfg" >"$HAPROXY_CFG"
    fi
    # Our additions to the example: a stats socket to see the check results.
    printf 'global\n    stats socket %s mode 600 level admin\n' "$RUN_DIR/haproxy.sock" >"$HA_DIR/haproxy-local.cfg"
    haproxy -c -q -f "$HAPROXY_CFG" -f "$HA_DIR/haproxy-local.cfg" >&2 || die "invalid $HAPROXY_CFG"
    # Foreground (-db) under our own pid file; it logs to stdout.
    spawn "$HA_DIR/haproxy.pid" "$HA_DIR/logs/haproxy.log" haproxy -db -f "$HAPROXY_CFG" -f "$HA_DIR/haproxy-local.cfg"
    # HAProxy counts every server as up until its checks fail: wait until only
    # the leader is up, then check that a session lands on the primary.
    for i in $(seq 150); do
        ok=0
        if lead=$(leader 2>/dev/null) && states=$(haproxy_states 2>/dev/null) &&
            awk -v l="${lead% *}" '$1 == l { if ($2 != "UP") bad = 1; seen = 1; next } $2 !~ /^DOWN/ { bad = 1 }
                END { exit !(seen && !bad) }' <<<"$states"; then
            r=$(PGCONNECT_TIMEOUT=2 psql -X -h "$HOST" -p "$HAPROXY_PORT" -U postgres -d postgres -Atc 'select pg_is_in_recovery()' 2>/dev/null </dev/null || true)
            [[ $r == f ]] && ok=1
        fi
        (( ok )) && break
        if (( i == 150 )); then
            log "HAProxy server states: $(tr '\n' ';' <<<"${states:-}")"
            tail_logs 20
            die "HAProxy on $HAPROXY_PORT does not lead to the primary"
        fi
        sleep 0.2
    done
    log "HAProxy on $HOST:$HAPROXY_PORT routes to the primary ${lead% *}"
    echo "postgres://postgres@$HOST:$HAPROXY_PORT/postgres"
}

cmd_haproxy_down() {
    local pid
    if pid=$(cat "$HA_DIR/haproxy.pid" 2>/dev/null) && pid_matches "$pid" "$HAPROXY_CFG"; then
        kill -TERM "$pid" 2>/dev/null || true
        wait_gone "$pid" "$HAPROXY_CFG" 50 || kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$HA_DIR/haproxy.pid"
}

usage() {
    cat >&2 <<EOF
usage: $0 COMMAND
  up [--async]        fresh etcd + Patroni pg1..pg3; prints the multi-host URL
  down                stop everything, remove \$HA_DIR ($HA_DIR)
  status              patronictl list
  url                 print the multi-host URL
  primary             print "NAME PORT" of the leader (exit 1 if none)
  switchover          planned switchover; prints the new leader "NAME PORT"
  kill-primary        SIGKILL the leader's postmaster; prints "NAME PORT"
  demote-in-place     leader read-only + its Patroni frozen; prints "OLD PORT -> NEW PORT"
  thaw                undo demote-in-place on every node
  stop-standby        stop a standby (the sync one if any); prints "NAME PORT"
  start-standby [NAME] start it again; prints "NAME PORT"
  wait-healthy [SECS] wait for leader + 2 streaming standbys (+ sync standby)
  haproxy-up          HAProxy on $HAPROXY_PORT -> primary; prints its URL
  haproxy-down        stop HAProxy
EOF
}

cmd=${1:-}
(( $# )) && shift
case $cmd in
    up) cmd_up "$@" ;;
    down) cmd_down ;;
    status) patronictl_ list ;;
    url) echo "$URL" ;;
    primary) cmd_primary ;;
    switchover) cmd_switchover ;;
    kill-primary) cmd_kill_primary ;;
    demote-in-place) cmd_demote_in_place ;;
    thaw) cmd_thaw ;;
    stop-standby) cmd_stop_standby ;;
    start-standby) cmd_start_standby "$@" ;;
    wait-healthy) cmd_wait_healthy "$@" ;;
    haproxy-up) cmd_haproxy_up ;;
    haproxy-down) cmd_haproxy_down ;;
    -h | --help | help) usage ;;
    *) usage; exit 2 ;;
esac
