#ifndef STALLWATCH_TICKS_H
#define STALLWATCH_TICKS_H

// What the BPF program (bpf/ticks.bpf.c) and stallmond share: the layout of its maps' values.
// Plain C types only: this header is compiled for -target bpf as well as for the host.

/// One thread of a watched process that has waited at least once (a loop), keyed by its TID (in
/// stallmond's PID namespace) in the `ticks` map. Times are CLOCK_MONOTONIC nanoseconds (bpf_ktime_get_ns). The thread alone
/// writes its entry, one 8-byte field per event, so a reader's copy is never inconsistent in a way
/// that matters: each field is either the old or the new value.
struct stallwatch_tick {
    /// When the thread's latest wait returned: its current tick began (0: never returned yet).
    unsigned long long tick_start_ns;
    /// When the thread's latest wait began. The thread is in a wait while this is at or after
    /// `tick_start_ns`.
    unsigned long long wait_start_ns;
    /// The latest tick that ended at or past the threshold: when it began and when it ended (0, 0:
    /// none yet). The program records it, so that a tick that ends between two scans is timed
    /// exactly by the kernel's clock.
    unsigned long long long_tick_start_ns;
    unsigned long long long_tick_end_ns;
    /// The thread's CPU time when its current tick began (the scheduler's `sum_exec_runtime`).
    unsigned long long tick_start_cpu_ns;
    /// The CPU time the latest long tick took.
    unsigned long long long_tick_cpu_ns;
    /// When the thread ended inside a long tick (0: it lives). The program keeps such a thread's
    /// entry, its tick ended by the exit, until stallmond has read it and removes it.
    unsigned long long exit_ns;
    /// The thread's process.
    unsigned int tgid;
    /// Waits seen, wrapping: a reader tells a new tick from the one it saw by `tick_start_ns`.
    unsigned int waits;
};

/// A thread's user-space registers as the kernel saved them when it entered the kernel (for a
/// thread blocked in a system call: at the call), in DWARF's x86-64 numbering (rax rdx rcx rbx rsi
/// rdi rbp rsp r8-r15), and its program counter. What the `user_registers` iterator writes.
struct stallwatch_user_registers {
    unsigned long long dwarf[16];
    unsigned long long pc;
};

/// The one entry of the `config` array map, set by stallmond before the first process is watched.
struct stallwatch_config {
    /// A tick this long or longer is recorded in `long_tick_*` when it ends.
    unsigned long long threshold_ns;
    /// stallmond's PID namespace (the device and inode of /proc/self/ns/pid): the program keys its
    /// maps by TGIDs and TIDs as stallmond sees them, in a container as on the host, and ignores
    /// the threads of processes outside it.
    unsigned long long pid_namespace_device;
    unsigned long long pid_namespace_inode;
};

#endif
