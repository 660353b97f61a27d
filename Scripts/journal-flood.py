#!/usr/bin/env python3
"""Writes stall entries the way any local user can: straight to journald's socket, with our
MESSAGE_IDs and whatever fields it likes. The collector tests run it as an unprivileged user.

    journal-flood.py --count N [--first K] [--overflow]

Each entry is an ended stall report with a distinct fingerprint (16 hex digits of K, K+1, ...).
--overflow adds four entries with values past every sane bound: a suppression count of
9223372036854775807 and then 1, and two durations near 2^64 microseconds.
Prints the number of entries sent.
"""
import argparse
import socket
import time
import uuid

ENDED = "28beac6e882f46aaa40f2556557097a6"
SUPPRESSED = "1332568df10e41a0927f220ff4dc212b"


def ended(fingerprint, duration="300000"):
    return {
        "MESSAGE_ID": ENDED, "MESSAGE": "main run loop stalled", "PRIORITY": "4",
        "SYSLOG_IDENTIFIER": "flood", "STALL_ID": uuid.uuid4().hex, "STALL_EVENT": "ended",
        "STALL_DURATION_USEC": duration, "STALL_THRESHOLD_USEC": "250000", "STALL_ACTIVITY": "after-waiting",
        "STALL_RUNLOOP_MODE": "kCFRunLoopDefaultMode", "STALL_CALLOUT": "timer", "STALL_LOOP": "main",
        "STALL_THREAD_TID": "7", "STALL_THREAD_STATE": "R", "STALL_THREAD_SYSCALL": "",
        "STALL_THREAD_WCHAN": "", "STALL_CPU_USEC": "1", "STALL_SAMPLES": "3", "STALL_SAMPLES_UNANSWERED": "0",
        "STALL_STACK_SAMPLES": "3", "STALL_FINGERPRINT": fingerprint, "STALL_FRAME": "Flood.f() (Flood.swift:1)",
        "STALL_BACKTRACE": "#0 Flood.f()",
    }


def suppressed(count):
    return {
        "MESSAGE_ID": SUPPRESSED, "MESSAGE": "stall reports suppressed", "PRIORITY": "5",
        "SYSLOG_IDENTIFIER": "flood", "STALL_LOOP": "main", "STALL_THREAD_TID": "7",
        "STALL_FINGERPRINT": "aaaaaaaaaaaaaaaa", "STALL_FRAME": "x", "STALL_SUPPRESSED_COUNT": count,
        "STALL_SUPPRESSED_TOTAL_USEC": "1", "STALL_SUPPRESSED_WORST_USEC": "1", "STALL_RATE_LIMIT_BURST": "5",
        "STALL_RATE_LIMIT_INTERVAL_USEC": "60000000",
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--overflow", action="store_true")
    parser.add_argument("--socket", default="/run/systemd/journal/socket")
    arguments = parser.parse_args()

    entries = [ended("%016x" % (arguments.first + index)) for index in range(arguments.count)]
    if arguments.overflow:
        entries += [suppressed("9223372036854775807"), suppressed("1"),
                    ended("%016x" % arguments.first, "18446744073709551615"),
                    ended("%016x" % arguments.first, "18446744073709551000")]
    journal = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    journal.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    for fields in entries:
        datagram = "".join("%s=%s\n" % item for item in fields.items()).encode()
        while True:
            try:
                journal.sendto(datagram, arguments.socket)
                break
            except (BlockingIOError, ConnectionRefusedError, OSError) as error:
                if getattr(error, "errno", None) not in (11, 105, 111):
                    raise
                time.sleep(0.001)
    print(len(entries))


if __name__ == "__main__":
    main()
