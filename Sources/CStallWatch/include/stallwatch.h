#ifndef STALLWATCH_H
#define STALLWATCH_H

// stallmond's tick watcher: loads the BPF program of bpf/ticks.bpf.c with libbpf, attaches it to
// the wait system calls' tracepoints, and gives the daemon its maps: the processes watched, and
// the ticks of their loops. Not thread-safe: one owner serializes all calls, except
// stallwatch_tick_of and stallwatch_blocked_registers, which only read what stallwatch_open set
// and may run on another thread beside them.

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "stallwatch_ticks.h"

// STALLMON_LINUX: the Linux implementation. Elsewhere this header declares nothing and the sources
// compile to nothing.
#include "stallmon_platform.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(STALLMON_LINUX)

typedef struct stallwatch stallwatch;

/// Which step of stallwatch_open failed.
typedef enum {
    STALLWATCH_STEP_NONE = 0,
    /// The kernel describes itself in no BTF (/sys/kernel/btf/vmlinux, CONFIG_DEBUG_INFO_BTF): the
    /// program's read of a task's CPU time cannot be relocated.
    STALLWATCH_STEP_BTF,
    /// No tracefs with the system call tracepoints (mounted at /sys/kernel/tracing, or under
    /// /sys/kernel/debug/tracing).
    STALLWATCH_STEP_TRACEFS,
    /// libbpf could not read the embedded object.
    STALLWATCH_STEP_OPEN,
    /// The kernel refused the maps or the programs (EPERM: no CAP_BPF; the verifier).
    STALLWATCH_STEP_LOAD,
    /// A tracepoint could not be attached (EACCES/EPERM: no CAP_PERFMON; ENOENT: no such tracepoint).
    STALLWATCH_STEP_ATTACH,
    /// The configuration could not be written to its map.
    STALLWATCH_STEP_CONFIG,
} stallwatch_step;

/// Why stallwatch_open failed: the step, the errno, the program or tracepoint concerned, and
/// libbpf's last warning (its first line), which says more when the verifier refuses the program.
typedef struct {
    stallwatch_step step;
    int error;
    char detail[96];
    char libbpf_message[256];
} stallwatch_failure;

/// One loop thread, as stallwatch_read copies it out of the `ticks` map.
typedef struct {
    uint32_t tid;
    struct stallwatch_tick tick;
} stallwatch_thread;

/// Loads the program, records ticks of `threshold_ns` or longer, and attaches it. NULL on
/// failure, with `failure` filled. libbpf prints nothing: its last warning is in `failure`, so
/// that a refusal is one line of stallmond's log.
stallwatch *stallwatch_open(uint64_t threshold_ns, stallwatch_failure *failure);

/// Adds a process (its TGID) to the watched ones: its threads are loops from their next wait.
/// 0, or a negative errno.
int stallwatch_watch(stallwatch *watch, uint32_t tgid);

/// Removes a process; its threads' entries are removed by stallwatch_forget. 0, or a negative errno
/// (-ENOENT: it was not watched).
int stallwatch_unwatch(stallwatch *watch, uint32_t tgid);

/// Removes a thread's entry (its process is no longer watched). 0, or a negative errno.
int stallwatch_forget(stallwatch *watch, uint32_t tid);

/// Copies thread `tid`'s entry into `tick`: one lookup, for a look at one stalled thread while
/// the scan goes on. 0, or a negative errno (-ENOENT: no such loop thread).
int stallwatch_tick_of(stallwatch *watch, uint32_t tid, struct stallwatch_tick *tick);

/// The user registers of thread `tid` (in the caller's PID namespace) as the kernel saved them
/// when it entered the kernel, through the program's task iterator attached to that one thread
/// (bpf_task_pt_regs, the link's `task.tid`; x86-64). For a thread blocked in a system call they
/// are its registers at the call: rbp and the other callee-saved ones that its syscall file lacks.
/// The thread is not stopped: a caller checks they match the syscall file's sp and pc and that the
/// thread is still blocked in the same call afterwards. Aiming at one thread needs Linux 6.7, or a
/// 6.1-6.6 stable kernel with the fix "bpf: Fix iter/task tid filtering": a kernel that gives more
/// than one record, or none for a thread that lives, turns the iterator off for good. 0, or a
/// negative errno (-EOPNOTSUPP: the kernel refused the iterator or cannot aim it; -ENOENT: no such
/// thread). Only on the thread that takes stacks.
int stallwatch_blocked_registers(stallwatch *watch, uint32_t tid, struct stallwatch_user_registers *registers);

/// Copies up to `capacity` loop threads into `threads`; returns how many (at most `capacity`; the
/// map holds at most 65536): all of them when fewer than `capacity`. Batch lookups, a few system
/// calls a scan whatever the number of threads (one lookup per entry where the kernel has none).
/// -ENOSPC when `capacity` was too small to take the entries of one of the map's buckets whole:
/// read again with a larger buffer.
int stallwatch_read(stallwatch *watch, stallwatch_thread *threads, int capacity);

/// Detaches the program and frees everything.
void stallwatch_close(stallwatch *watch);

/// Unwinds thread `tid` of process `pid`, blocked in a system call with stack pointer `sp` and
/// program counter `pc` (its /proc/PID/task/TID/syscall), from the process's memory and unwind
/// tables, without stopping or signalling it (stack.c). Like every unwinding function here, it
/// keeps a view of each process's images between calls (stallwatch_forget_process): call them
/// from one thread only, the one that takes stacks. Writes at most `capacity` code addresses,
/// `pc` first and return addresses after; returns how many, or -1 when the process's memory or
/// images cannot be read.
int stallwatch_unwind_blocked(pid_t pid, pid_t tid, uint64_t sp, uint64_t pc, uint64_t *frames, int capacity);

/// Forgets what the unwinding kept of process `pid` (its images, read once for every look while
/// its maps stay the same): for a process no longer watched. Like the unwinding, on the thread
/// that takes stacks.
void stallwatch_forget_process(pid_t pid);

/// As stallwatch_unwind_blocked, from every register (stallwatch_blocked_registers): the walk goes
/// on through frame-pointer frames, where sp and pc alone stop at the first. x86-64 only; -1
/// elsewhere.
int stallwatch_unwind_blocked_registers(pid_t pid, pid_t tid, const struct stallwatch_user_registers *registers,
                                        uint64_t *frames, int capacity);

/// The stack of thread `tid` of process `pid` while it runs: a perf event on the thread (task
/// clock, user space) copies its registers and stack top once it has run a millisecond, waiting up
/// to `timeout_ms`; unwound like stallwatch_unwind_blocked, the stack read from the copy (stack.c).
/// Returns the count of addresses written, or -1 (no sample: the thread did not run, or the
/// kernel refused the event). x86-64 only; -1 elsewhere.
int stallwatch_sample_running(pid_t pid, pid_t tid, int timeout_ms, uint64_t *frames, int capacity);

/// The monotonic clock the program's times are read from (CLOCK_MONOTONIC, as bpf_ktime_get_ns).
uint64_t stallwatch_now_ns(void);

#endif

#ifdef __cplusplus
}
#endif

#endif
