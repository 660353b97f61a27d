#!/usr/bin/env bash
# Boots a real systemd (PID 1) in private PID, mount, cgroup, UTS, IPC and network namespaces, so the
# integration tests can install units, start services and read a journal without touching the host.
#
# Usage (as root):
#   Scripts/systemd-namespace.sh [--name NAME] start [--timeout SECONDS]
#   Scripts/systemd-namespace.sh [--name NAME] exec CMD [ARG...]     # exit status is CMD's
#   Scripts/systemd-namespace.sh [--name NAME] install-unit FILE [UNIT-NAME | UNIT.d/DROPIN.conf]
#   Scripts/systemd-namespace.sh [--name NAME] copy FILE PATH [MODE]      # host file into the namespace
#   (FILE may be - for standard input)
#   Scripts/systemd-namespace.sh [--name NAME] stop [--graceful]
#   Scripts/systemd-namespace.sh [--name NAME] status
#   Scripts/systemd-namespace.sh list                                  # every instance, running or not
#   Scripts/systemd-namespace.sh verify UNIT-FILE...   # systemd-analyze verify, before installing
#
# NAME (default "default", or $STALLMON_NS_NAME) selects an instance: several instances may run at
# once. The host keeps one directory per instance, $STALLMON_NS_STATE_DIR (default
# /run/stallmon-ns)/NAME, holding `pid` (the namespace's PID 1 as the host sees it), `unshare-pid`,
# `pidns` (its PID namespace inode), `cgroup` (the host cgroup it lives in) and `console.log` (what
# systemd writes to its console: boot messages and units' console output).
#
# What the namespace sees of the host, and what it cannot change:
#   /etc, /usr, /var   overlays: the host's files, read-only underneath; every write goes to a tmpfs and
#                      vanishes at `stop` (so `install.sh` with an empty DESTDIR may run inside)
#   /etc/systemd/system, /run, /tmp, /dev/shm, /var/log/journal
#                      fresh tmpfs: none of the host's enabled units, sockets, journals or temporary
#                      files (systemd-tmpfiles would otherwise empty the host's /tmp at boot)
#   /etc/machine-id    a fresh one: the namespace's journal is its own
#   /sys, /proc/sys    read-only (no sysctl or udev reaches the host); /sys/fs/cgroup is a cgroup2 mount
#                      of the instance's own cgroup (host: <cgroup2 mount>/stallmon-ns.NAME), made the
#                      root of a cgroup namespace
#   /dev/console       the instance's console.log; /dev/kmsg is /dev/null
#   network            its own namespace (loopback only): a service inside cannot take a host port
# Units that act on the kernel as a whole (udev, sysctl, modules, binfmt, swap, clock, repart, TPM,
# audit) and every generator are masked. The default target is `stallmon-ns.target`: basic.target
# plus the journal, nothing the host has enabled.
#
# `verify` needs no instance: it runs `systemd-analyze verify --recursive-errors=yes --man=no` in a
# private mount namespace where each missing absolute Exec*= program (the binaries not built or
# installed yet) is an empty stub, so that verify checks the unit rather than the installation.
#
# Everything inside dies with PID 1: `stop` kills it, waits for every process of the PID namespace to
# be gone, removes the instance's cgroup and state directory, and fails if anything is left.
set -euo pipefail

readonly SELF=$(readlink -f "${BASH_SOURCE[0]}")
NAME=${STALLMON_NS_NAME:-default}
STATE_ROOT=${STALLMON_NS_STATE_DIR:-/run/stallmon-ns}

die() { echo "systemd-namespace: $*" >&2; exit 1; }
usage() { sed -n '5,14s/^# \{0,1\}//p' "$SELF" >&2; exit 64; }

# The cgroup2 hierarchy the host mounts (pure unified: /sys/fs/cgroup; hybrid: /sys/fs/cgroup/unified).
cgroup2_mount() {
    local target
    target=$(findmnt -rn -t cgroup2 -o TARGET | head -n 1)
    [[ -n $target ]] || die "no cgroup2 hierarchy is mounted on the host"
    echo "$target"
}

# This process's cgroup in the cgroup2 hierarchy.
own_cgroup() { sed -n 's/^0:://p' /proc/self/cgroup | sed 's|/$||'; }

state_dir() { echo "$STATE_ROOT/$NAME"; }

pid1() {
    local state pid
    state=$(state_dir)
    [[ -f $state/pid ]] || die "instance '$NAME' is not running (no $state/pid)"
    pid=$(<"$state/pid")
    [[ -d /proc/$pid ]] || die "instance '$NAME' is not running (PID 1, host pid $pid, is gone)"
    echo "$pid"
}

# Runs a command in the namespace: its PID namespace (so it dies with the namespace), mounts, cgroup
# namespace, UTS, IPC and network.
# The working directory is kept unless it lies where the namespace has its own files.
in_ns() {
    local pid wd=$PWD
    pid=$(pid1)
    case $wd/ in
        /tmp/* | /run/* | /var/tmp/* | /dev/shm/*) wd=/ ;;
    esac
    nsenter --target "$pid" --pid --mount --cgroup --uts --ipc --net --wd="$wd" -- \
        env SYSTEMD_PAGER= SYSTEMD_COLORS=0 "$@"
}

# Every host pid whose PID namespace is the instance's.
ns_members() {
    find /proc/[0-9]*/ns/pid -maxdepth 0 -lname "pid:\[$1\]" 2>/dev/null | cut -d/ -f3 | tr '\n' ' '
    return 0
}

# ---------------------------------------------------------------------------------------------------
# Runs as the namespace's PID 1 (from `unshare`): builds the private view of the file system, then
# becomes systemd.
pid1_main() {
    local state=$1
    local scratch=$state/scratch

    # Console and kernel log: never the host's. (First: the state directory may be under /run.)
    mount --bind "$state/console.log" /dev/console
    mount --bind /dev/null /dev/kmsg
    mount -t tmpfs -o mode=0700 stallmon-ns "$scratch"
    for dir in etc usr var; do
        mkdir -p "$scratch/$dir/upper" "$scratch/$dir/work"
        mount -t overlay stallmon-ns -o "lowerdir=/$dir,upperdir=$scratch/$dir/upper,workdir=$scratch/$dir/work" "/$dir"
    done
    mount -t tmpfs -o mode=0755,nosuid,nodev stallmon-ns /run
    mount -t tmpfs -o mode=1777,nosuid,nodev stallmon-ns /tmp
    mount -t tmpfs -o mode=1777,nosuid,nodev stallmon-ns /dev/shm
    mkdir -p /var/log/journal
    mount -t tmpfs -o mode=2755,nosuid,nodev stallmon-ns /var/log/journal
    mount -t tmpfs -o mode=0755 stallmon-ns /etc/systemd/system

    # A machine of its own: its journal files, its hostname.
    tr -d '-' </proc/sys/kernel/random/uuid >/etc/machine-id
    echo "stallmon-ns-$NAME" >/etc/hostname

    # Kernel knobs stay the host's; cgroups are the instance's own subtree.
    for dir in /proc/sys /proc/sysrq-trigger; do
        if [[ -e $dir ]]; then
            mount --bind "$dir" "$dir"
            mount -o remount,bind,ro "$dir"
        fi
    done
    umount -R /sys/fs/cgroup 2>/dev/null || true
    mount -o remount,bind,ro /sys
    mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 /sys/fs/cgroup

    # Nothing the host has enabled, and nothing that acts on the whole kernel.
    local unit
    local -a masked=(
        getty.target console-getty.service systemd-logind.service systemd-user-sessions.service
        systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket
        systemd-udev-trigger.service systemd-udev-settle.service systemd-hwdb-update.service
        systemd-remount-fs.service systemd-fsck-root.service systemd-journald-audit.socket
        systemd-timesyncd.service systemd-time-wait-sync.service systemd-pstore.service
        systemd-boot-update.service systemd-boot-system-token.service swap.target
        systemd-tmpfiles-clean.timer timers.target systemd-update-utmp-runlevel.service
    )
    for unit in /lib/systemd/system/sysinit.target.wants/*; do
        case ${unit##*/} in
            systemd-journald.service | systemd-journal-flush.service | systemd-tmpfiles-setup.service) ;;
            *) masked+=("${unit##*/}") ;;
        esac
    done
    for unit in "${masked[@]}"; do ln -sf /dev/null "/etc/systemd/system/$unit"; done
    mkdir -p /etc/systemd/system-generators
    for unit in /lib/systemd/system-generators/* /usr/lib/systemd/system-generators/*; do
        [[ -e $unit ]] && ln -sf /dev/null "/etc/systemd/system-generators/${unit##*/}"
    done
    cat >/etc/systemd/system/stallmon-ns.target <<'EOF'
[Unit]
Description=stallmon test namespace
Requires=basic.target
Wants=systemd-journald.service
After=basic.target
AllowIsolate=yes
EOF
    ln -sf stallmon-ns.target /etc/systemd/system/default.target

    export container=stallmon-ns
    exec /lib/systemd/systemd --show-status=no
}

# ---------------------------------------------------------------------------------------------------
cmd_start() {
    local timeout=60
    while (($#)); do
        case $1 in
            --timeout) timeout=${2:?}; shift 2 ;;
            *) usage ;;
        esac
    done
    [[ $(id -u) == 0 ]] || die "must run as root"
    local state cg upid pid inode deadline status
    state=$(state_dir)
    if [[ -f $state/pid && -d /proc/$(<"$state/pid") ]]; then
        die "instance '$NAME' already runs (host pid $(<"$state/pid")); stop it first"
    fi
    rm -rf "$state"
    mkdir -p "$state/scratch"
    : >"$state/console.log"
    # A start that fails leaves nothing behind.
    trap 'cmd_stop >/dev/null 2>&1 || true' EXIT

    cg=$(cgroup2_mount)/stallmon-ns.$NAME
    [[ ! -d $cg ]] || find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [[ ! -d $cg ]] || die "cgroup $cg is left over and busy: is an old instance '$NAME' still running?"
    mkdir "$cg"
    echo "$cg" >"$state/cgroup"

    # The subshell moves itself into the instance's cgroup, which the cgroup namespace then roots at.
    (
        echo "$BASHPID" >"$cg/cgroup.procs"
        # Inherit no descriptor but the three standard ones: a caller that waits for its pipes or
        # sockets to close (Foundation's Process does) would otherwise wait for the namespace to end.
        for fd in /proc/$BASHPID/fd/*; do
            fd=${fd##*/}
            ((fd > 2)) && eval "exec $fd>&-" 2>/dev/null || true
        done
        exec setsid unshare --pid --fork --kill-child --mount --mount-proc --propagation private \
            --cgroup --uts --ipc --net -- "$SELF" --name "$NAME" __pid1 "$state"
    ) </dev/null >>"$state/console.log" 2>&1 &
    upid=$!
    echo "$upid" >"$state/unshare-pid"

    deadline=$((SECONDS + timeout))
    pid=
    while [[ -z $pid ]]; do
        pid=$(cat "/proc/$upid/task/$upid/children" 2>/dev/null | awk '{print $1}') || true
        [[ -n $pid ]] && break
        [[ -d /proc/$upid ]] || { cat "$state/console.log" >&2; die "the namespace did not start"; }
        ((SECONDS < deadline)) || die "the namespace did not start within ${timeout}s"
        sleep 0.02
    done
    echo "$pid" >"$state/pid"
    inode=$(stat -L -c %i "/proc/$pid/ns/pid")
    echo "$inode" >"$state/pidns"
    # unshare itself goes back to our cgroup: the instance's cgroup (the namespace's root cgroup)
    # then holds only the namespace's processes, and systemd may enable controllers below it.
    echo "$upid" >"$(cgroup2_mount)$(own_cgroup)/cgroup.procs" 2>/dev/null || true

    # Wait for PID 1 to be systemd, then for the boot to finish.
    while [[ $(readlink "/proc/$pid/exe" 2>/dev/null) != */systemd ]]; do
        [[ -d /proc/$pid ]] || { cat "$state/console.log" >&2; die "PID 1 died before systemd ran"; }
        ((SECONDS < deadline)) || die "PID 1 did not become systemd within ${timeout}s"
        sleep 0.02
    done
    while :; do
        status=$(in_ns systemctl is-system-running 2>/dev/null) || true
        case $status in
            running | degraded) break ;;
        esac
        if ! [[ -d /proc/$pid ]]; then
            cat "$state/console.log" >&2
            die "systemd died while booting"
        fi
        if ((SECONDS >= deadline)); then
            in_ns systemctl list-jobs --no-legend >&2 || true
            die "systemd did not finish booting within ${timeout}s (state: ${status:-unknown})"
        fi
        sleep 0.05
    done
    trap - EXIT
    echo "$pid"
    [[ $status == running ]] || {
        echo "systemd-namespace: instance '$NAME' is degraded:" >&2
        in_ns systemctl --failed --no-legend >&2 || true
    }
}

cmd_stop() {
    local graceful=0
    while (($#)); do
        case $1 in
            --graceful) graceful=1; shift ;;
            *) usage ;;
        esac
    done
    local state pid upid inode cg deadline left
    state=$(state_dir)
    [[ -d $state ]] || return 0
    pid=$(cat "$state/pid" 2>/dev/null) || true
    upid=$(cat "$state/unshare-pid" 2>/dev/null) || true
    inode=$(cat "$state/pidns" 2>/dev/null) || true
    cg=$(cat "$state/cgroup" 2>/dev/null) || true

    if [[ -n $pid && -d /proc/$pid ]]; then
        if ((graceful)); then
            # SIGRTMIN+4: poweroff.target; in a container systemd then exits.
            kill -s RTMIN+4 "$pid" 2>/dev/null || true
            deadline=$((SECONDS + 20))
            while [[ -d /proc/$pid ]] && ((SECONDS < deadline)); do sleep 0.05; done
        fi
        # The kernel kills every other process of a PID namespace when its PID 1 dies. unshare, its
        # parent, reaps it and exits (killing unshare first would leave the zombie to the host's init).
        kill -s KILL "$pid" 2>/dev/null || true
    fi

    deadline=$((SECONDS + 10))
    while :; do
        left=
        [[ -n $inode ]] && left=$(ns_members "$inode")
        [[ -n $upid && -d /proc/$upid && $(cat "/proc/$upid/comm" 2>/dev/null) == unshare ]] && left+=" $upid"
        [[ -z ${left// /} ]] && break
        if ((SECONDS >= deadline - 5)) && [[ -n $upid ]]; then kill -s KILL "$upid" 2>/dev/null || true; fi
        ((SECONDS < deadline)) || die "processes of instance '$NAME' are still alive: $left"
        sleep 0.01
    done
    if [[ -n $cg && -d $cg ]]; then
        deadline=$((SECONDS + 10))
        until find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null && [[ ! -d $cg ]]; do
            ((SECONDS < deadline)) || die "cannot remove cgroup $cg: $(find "$cg" -name cgroup.procs -exec cat {} + | tr '\n' ' ')"
            sleep 0.02
        done
    fi
    rm -rf "$state"
}

# Installs into the namespace's /etc/systemd/system (a unit, or a drop-in as UNIT.d/NAME.conf) and
# reloads systemd.
cmd_install_unit() {
    (($# >= 1 && $# <= 2)) || usage
    local file=$1 unit=${2:-$(basename "$1")}
    [[ $file == - || -f $file ]] || die "no such file: $file"
    [[ $file != - || $# == 2 ]] || die "install-unit - needs the unit's name"
    [[ $file != - ]] || file=/dev/stdin
    [[ $unit =~ ^[^/]+(\.d/[^/]+\.conf)?$ && $unit != .* ]] || die "not a unit or UNIT.d/DROPIN.conf name: $unit"
    in_ns sh -c 'mkdir -p "$(dirname "$1")" && cat >"$1" && systemctl daemon-reload' sh \
        "/etc/systemd/system/$unit" <"$file"
}

# Copies a host file into the namespace (its /tmp, /run, /etc, /usr and /var are its own).
cmd_copy() {
    (($# >= 2 && $# <= 3)) || usage
    local file=$1 path=$2 mode=${3:-0644}
    [[ $file == - || -f $file ]] || die "no such file: $file"
    [[ $file != - ]] || file=/dev/stdin
    [[ $path == /* ]] || die "the destination must be an absolute path: $path"
    in_ns sh -c 'mkdir -p "$(dirname "$1")" && cat >"$1" && chmod "$2" "$1"' sh "$path" "$mode" <"$file"
}

cmd_verify() {
    (($#)) || usage
    local file
    for file; do [[ -f $file ]] || die "no such file: $file"; done
    local scratch status=0
    scratch=$(mktemp -d)
    unshare --mount --propagation private -- "$SELF" __verify "$scratch" "$@" || status=$?
    rmdir "$scratch"
    return "$status"
}

# In a private mount namespace: stubs for missing programs, then verify.
verify_main() {
    local program dir scratch=$1
    shift
    mount -t tmpfs stallmon-ns-verify "$scratch"
    # Exec*=[-@:+!]*/absolute/path ...
    for program in $(sed -nE 's/^Exec[A-Za-z]*=[-@:+!]*(\/[^ ]+).*/\1/p' "$@" | sort -u); do
        [[ -x $program ]] && continue
        dir=$(dirname "$program")
        if ! findmnt -rn -o FSTYPE --target "$dir" | grep -qx overlay; then
            mkdir -p "$dir" 2>/dev/null || die "cannot create $dir for a stub of $program"
            mkdir -p "$scratch$dir/upper" "$scratch$dir/work"
            mount -t overlay stallmon-ns-verify \
                -o "lowerdir=$dir,upperdir=$scratch$dir/upper,workdir=$scratch$dir/work" "$dir"
        fi
        printf '#!/bin/sh\nexit 0\n' >"$program"
        chmod 0755 "$program"
        echo "systemd-namespace: verify: $program is a stub" >&2
    done
    systemd-analyze verify --recursive-errors=yes --man=no "$@"
}

cmd_list() {
    local state pid
    for state in "$STATE_ROOT"/*/; do
        [[ -d $state ]] || continue
        pid=$(cat "$state/pid" 2>/dev/null) || true
        if [[ -n $pid && -d /proc/$pid ]]; then
            echo "$(basename "$state") running (PID 1 is host pid $pid)"
        else
            echo "$(basename "$state") dead (remove it with: $SELF --name $(basename "$state") stop)"
        fi
    done
}

cmd_status() {
    local pid
    pid=$(pid1)
    echo "instance $NAME: PID 1 is host pid $pid"
    in_ns systemctl is-system-running || true
}

# ---------------------------------------------------------------------------------------------------
while (($#)); do
    case $1 in
        --name) NAME=${2:?--name needs a value}; shift 2 ;;
        --name=*) NAME=${1#--name=}; shift ;;
        *) break ;;
    esac
done
[[ $NAME =~ ^[A-Za-z0-9_.-]+$ ]] || die "instance name must be [A-Za-z0-9_.-]+: $NAME"
(($#)) || usage
command=$1; shift
case $command in
    start) cmd_start "$@" ;;
    stop) cmd_stop "$@" ;;
    exec) (($#)) || usage; in_ns "$@" ;;
    install-unit) cmd_install_unit "$@" ;;
    copy) cmd_copy "$@" ;;
    status) cmd_status ;;
    list) cmd_list ;;
    verify) cmd_verify "$@" ;;
    __verify) verify_main "$@" ;;
    __pid1) pid1_main "$@" ;;
    -h | --help | help) usage ;;
    *) usage ;;
esac
