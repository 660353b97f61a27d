#!/usr/bin/env bash
# Many hosts, one collector, over systemd's own transport: three hosts and a central host on this
# machine, each a real systemd (Scripts/systemd-namespace.sh: its own PID, mount, UTS and network
# namespaces, journald and machine id), joined by veth pairs whose addresses (10.213.N.0/24) exist
# only inside those namespaces.
#
# Each host runs a service that stalls under the monitor (StallmonFixture service, its reports in
# the host's journal) and systemd-journal-upload, which ships the host's journal over HTTP to the
# central host's systemd-journal-remote (socket-activated on port 19532, writing
# /var/log/journal/remote). The central host runs stallmond (the shipped unit and the shipped
# stallmond-remote.conf drop-in) on those files.
#
# Meanwhile stallmond is killed (SIGKILL) and restarted, and later restarted gracefully, and host
# b's uploader is killed (SIGKILL) in the middle of a stream of 20000 lines and started again a
# few seconds later, while the other hosts go on. Then every host's count of stalls in its own
# journal must equal what stallmond counted for it (state.json and stallmon_host_stalls_total),
# `stallmon report --directory /var/log/journal/remote` must show the stall on 3 hosts, and the
# remote journal must hold every stall of every host.
#
# Usage (as root): Scripts/fleet-test.sh [BUILD-DIRECTORY]   (default: swift build --show-bin-path)
# Exit status 0 when every count agrees; 77 when this machine cannot run it (not root, or no
# systemd-journal-remote); 1 otherwise, with what differed.
set -euo pipefail
cd "$(dirname "$0")/.."
readonly REPO=$PWD
readonly NS=$REPO/Scripts/systemd-namespace.sh
BUILD=${1:-$(swift build --show-bin-path)}
readonly ENDED=28beac6e882f46aaa40f2556557097a6

skip() { echo "fleet-test: skipped: $*" >&2; exit 77; }
[[ $(id -u) == 0 ]] || skip "needs root"
[[ -x /lib/systemd/systemd-journal-remote && -x /lib/systemd/systemd-journal-upload ]] ||
    skip "needs systemd-journal-remote (apt-get install systemd-journal-remote)"
command -v ip >/dev/null || skip "needs iproute2"
for program in StallmonFixture stallmond stallmond-daemon stallmon; do
    [[ -x $BUILD/$program ]] || { echo "fleet-test: $BUILD/$program is not built" >&2; exit 1; }
done

readonly TAG=f$$
readonly HOSTS=(a b c)
readonly CENTRAL=$TAG-central
log() { echo "fleet-test: [$(date -u +%T)] $*" >&2; }
in_ns() { local name=$1; shift; "$NS" --name "$name" exec "$@"; }
central() { in_ns "$CENTRAL" "$@"; }

cleanup() {
    local status=$?
    if ((status != 0 && status != 77)) && [[ -n ${STARTED:-} ]]; then
        log "failed; stallmond's log:"
        central journalctl -u stallmond.service --no-pager -n 40 >&2 2>/dev/null || true
    fi
    for name in "${HOSTS[@]/#/$TAG-}" "$CENTRAL"; do "$NS" --name "$name" stop >/dev/null 2>&1 || true; done
    exit "$status"
}
trap cleanup EXIT

log "booting 3 hosts and the central host"
pids=()
for name in "${HOSTS[@]/#/$TAG-}" "$CENTRAL"; do
    "$NS" --name "$name" start --timeout 90 >"/tmp/$TAG-$name.pid" &
    pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
STARTED=1
pid_of() { cat "/tmp/$TAG-$1.pid"; }

# The network: one veth pair per host, both ends created straight inside the namespaces.
for i in 1 2 3; do
    name=$TAG-${HOSTS[i - 1]}
    ip link add "${TAG}h$i" netns "$(pid_of "$name")" type veth peer name "${TAG}c$i" netns "$(pid_of "$CENTRAL")"
    in_ns "$name" sh -c "ip link set lo up && ip addr add 10.213.$i.2/24 dev ${TAG}h$i && ip link set ${TAG}h$i up"
    central sh -c "ip link set lo up && ip addr add 10.213.$i.1/24 dev ${TAG}c$i && ip link set ${TAG}c$i up"
done
rm -f /tmp/$TAG-*.pid

log "central: systemd-journal-remote (HTTP, socket-activated) and stallmond"
"$NS" --name "$CENTRAL" copy "$BUILD/stallmond" /usr/local/bin/stallmond 0755
"$NS" --name "$CENTRAL" copy "$BUILD/stallmond-daemon" /usr/local/bin/stallmond-daemon 0755
"$NS" --name "$CENTRAL" copy "$BUILD/stallmon" /usr/local/bin/stallmon 0755
# The shipped unit listens for HTTPS; the test has no certificates.
"$NS" --name "$CENTRAL" install-unit - systemd-journal-remote.service.d/http.conf <<'EOF'
[Service]
ExecStart=
ExecStart=/lib/systemd/systemd-journal-remote --listen-http=-3 --output=/var/log/journal/remote/
EOF
central systemctl start systemd-journal-remote.socket
"$NS" --name "$CENTRAL" install-unit systemd/stallmond.service
"$NS" --name "$CENTRAL" install-unit systemd/stallmond-remote.conf stallmond.service.d/remote.conf
"$NS" --name "$CENTRAL" install-unit - stallmond.service.d/test.conf <<'EOF'
[Service]
Environment=STALLMOND_METRICS_PATH=/var/lib/stallmond/stallmon.prom
Environment=STALLMOND_METRICS_INTERVAL_S=1
Environment=STALLMOND_DIGEST_INTERVAL_S=0
EOF
central systemctl start stallmond.service

log "hosts: a stalling service and systemd-journal-upload"
for i in 1 2 3; do
    name=$TAG-${HOSTS[i - 1]}
    "$NS" --name "$name" copy "$BUILD/StallmonFixture" /usr/local/bin/StallmonFixture 0755
    "$NS" --name "$name" install-unit - fleet-stall.service <<'EOF'
[Unit]
Description=a service that stalls every two seconds

[Service]
Type=notify
ExecStart=/usr/local/bin/StallmonFixture service --stall-ms 150
Environment=STALLMON_THRESHOLD_MS=100
Environment=STALLMON_RATE_LIMIT_BURST=1000
EOF
    "$NS" --name "$name" install-unit systemd/stallmon-monitored.conf fleet-stall.service.d/stallmon.conf
    "$NS" --name "$name" install-unit - systemd-journal-upload.service.d/url.conf <<EOF
[Service]
ExecStart=
ExecStart=/lib/systemd/systemd-journal-upload --save-state --url=http://10.213.$i.1:19532
EOF
    in_ns "$name" systemctl start fleet-stall.service systemd-journal-upload.service
done

sleep 5
log "stallmond: SIGKILL, then started again"
central systemctl kill --signal=SIGKILL stallmond.service
sleep 0.5
central systemctl restart stallmond.service

log "host b: its uploader stopped while it stalls on, then 20000 lines to upload, and the uploader killed (SIGKILL) in the middle of them"
b_id=$(in_ns "$TAG-b" cat /etc/machine-id)
filler() { central journalctl -D /var/log/journal/remote "_MACHINE_ID=$b_id" SYSLOG_IDENTIFIER=fleet-filler -o cat | wc -l; }
# The stalls of these seconds and the filler lines go in one upload, which the kill cuts short:
# journal-remote has written the stalls, the uploader has not saved their cursor, and sends them again.
in_ns "$TAG-b" systemctl stop systemd-journal-upload.service
sleep 3
in_ns "$TAG-b" sh -c 'seq 1 20000 | sed "s/^/filler /" | systemd-cat -t fleet-filler'
# journald takes the stream in after systemd-cat returns: the upload must find it whole.
until (($(in_ns "$TAG-b" journalctl SYSLOG_IDENTIFIER=fleet-filler -o cat | wc -l) >= 20000)); do sleep 0.1; done
in_ns "$TAG-b" systemctl start systemd-journal-upload.service
until (($(filler) > 0)); do sleep 0.02; done
in_ns "$TAG-b" systemctl kill --signal=SIGKILL systemd-journal-upload.service
in_ns "$TAG-b" systemctl stop systemd-journal-upload.service || true
log "host b's uploader died after shipping $(filler) of the $(in_ns "$TAG-b" journalctl SYSLOG_IDENTIFIER=fleet-filler -o cat | wc -l) filler entries its journal holds"
sleep 4
log "host b's uploader started again; stallmond restarted (SIGTERM)"
in_ns "$TAG-b" systemctl start systemd-journal-upload.service
central systemctl restart stallmond.service
sleep 4
for name in "${HOSTS[@]/#/$TAG-}"; do in_ns "$name" systemctl stop fleet-stall.service; done

# What each host's journal holds: its stalls, one ended entry each.
declare -A expected machine
for host in "${HOSTS[@]}"; do
    name=$TAG-$host
    machine[$host]=$(in_ns "$name" cat /etc/machine-id)
    expected[$host]=$(in_ns "$name" journalctl "MESSAGE_ID=$ENDED" -o export |
        sed -n 's/^STALL_ID=//p' | sort -u | wc -l)
done

remote_count() { # distinct stalls and ended entries of a machine in the remote journal
    central journalctl -D /var/log/journal/remote "_MACHINE_ID=$1" "MESSAGE_ID=$ENDED" -o export |
        sed -n 's/^STALL_ID=//p' | sort | awk '{ n++; if ($0 != last) d++; last = $0 } END { print d + 0, n + 0 }'
}
metric() { # stallmon_host_stalls_total of a machine, or 0
    central cat /var/lib/stallmond/stallmon.prom 2>/dev/null |
        sed -n "s/^stallmon_host_stalls_total{.*machine_id=\"$1\"} //p" | head -n 1 | grep . || echo 0
}

log "waiting for the uploads and stallmond to catch up"
waited=$SECONDS
deadline=$((SECONDS + 60))
while :; do
    done_all=1
    for host in "${HOSTS[@]}"; do
        read -r distinct _ <<<"$(remote_count "${machine[$host]}")"
        [[ $distinct == "${expected[$host]}" && $(metric "${machine[$host]}") == "${expected[$host]}" ]] || done_all=0
    done
    ((done_all)) && break
    ((SECONDS < deadline)) || break
    sleep 1
done
log "caught up (or gave up) after $((SECONDS - waited)) s"
central systemctl stop stallmond.service
state=$(central cat /var/lib/stallmond/state.json)

failed=0
for host in "${HOSTS[@]}"; do
    id=${machine[$host]}
    read -r distinct entries <<<"$(remote_count "$id")"
    counted=$(python3 -c 'import json,sys; s=json.loads(sys.argv[1]); print(s["hosts"].get(sys.argv[2],{}).get("stalls",0))' "$state" "$id")
    name=$(python3 -c 'import json,sys; s=json.loads(sys.argv[1]); print(s["hosts"].get(sys.argv[2],{}).get("name",""))' "$state" "$id")
    echo "host $host ($name, $id): its journal ${expected[$host]} stalls; remote journal $distinct stalls in $entries entries; stallmond $counted (metric $(metric "$id"))"
    if [[ $counted != "${expected[$host]}" || $distinct != "${expected[$host]}" || ${expected[$host]} -lt 5 ]]; then
        failed=1
    fi
    # The killed upload was sent again: the remote journal holds some of host b's stalls twice.
    if [[ $host == b ]] && ((entries <= distinct)); then
        echo "host b: no stall was sent twice: the kill did not cut an upload short" >&2
        failed=1
    fi
    [[ $name == "stallmon-ns-$TAG-$host" ]] || { echo "host $host: stallmond names it '$name'" >&2; failed=1; }
done
python3 - "$state" <<'PY' || failed=1
import json, sys
state = json.loads(sys.argv[1])
print(f"stallmond: {len(state['sources'])} source machines, {state['duplicateEntries']} duplicate entries skipped, "
      f"{state['malformedEntries']} malformed, {sum(u['stalls'] for u in state['units'].values())} stalls in all")
units = state["units"]
fixture = units.get("fleet-stall.service")
if fixture is None:
    sys.exit("no fleet-stall.service in stallmond's state")
labeled = [f for f in fixture["fingerprints"].values() if f["labeled"]]
hosts = max(sum(bin(word).count("1") for word in f["hostBits"]) for f in labeled)
print(f"fleet-stall.service: {fixture['stalls']} stalls, the heaviest fingerprint on {hosts} hosts")
if hosts != 3:
    sys.exit("the fixture's fingerprint should be on 3 hosts")
PY
report=$(central stallmon report --directory /var/log/journal/remote --unit fleet-stall.service)
echo "$report"
total=$((expected[a] + expected[b] + expected[c]))
echo "$report" | awk -v total="$total" 'NR > 1 && $4 == 3 { sum += $3 } END { exit !(sum == total) }' || {
    echo "stallmon report should show all $total stalls on 3 hosts" >&2
    failed=1
}
((failed == 0)) || { echo "fleet-test: FAILED" >&2; exit 1; }
echo "fleet-test: passed"
