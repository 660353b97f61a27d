#ifndef STALLMON_STALLCAPTURE_THREADVIEW_H
#define STALLMON_STALLCAPTURE_THREADVIEW_H

// The kernel's view of a thread of this process, from its small /proc files
// (/proc/self/task/<tid>/…): each read with one open, read and close, and each format parsed here
// once, for the sampler (sampler.c), perf events (perf.c), the NIO backend's look at epoll_wait and
// ThreadInspector in Swift. Watchdog side only: nothing here runs in a signal handler.

#include "stallmon_platform.h"

#if defined(STALLMON_LINUX)

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/// Whose /proc files a `tid` below names besides a thread of this process by its id. Negative, so
/// that a thread ID never read (0) names no thread rather than the caller.
enum {
    STALLMON_THREAD_SELF = -2,    ///< the calling thread: /proc/thread-self
    STALLMON_WHOLE_PROCESS = -1,  ///< the process: /proc/self
};

/// Opens /proc file `name` of thread `tid` (or STALLMON_THREAD_SELF, STALLMON_WHOLE_PROCESS)
/// read-only and close-on-exec: the descriptor, or -1.
int stallmon_thread_file_open(pid_t tid, const char *name);

/// Reads /proc file `name` of thread `tid` into `buffer`, NUL-terminated (at most `size` - 1
/// bytes): the count read, or -1 when the file cannot be read or is empty. No allocation.
ssize_t stallmon_thread_file_read(pid_t tid, const char *name, char *buffer, size_t size);

/// 1 while thread `tid` of this process exists, else 0.
int stallmon_thread_exists(pid_t tid);

// MARK: - syscall

/// A thread's system call as `/proc/self/task/<tid>/syscall` shows it.
typedef struct {
    int state;          ///< 0: blocked in `number`; 1: running in user space; -1: unreadable
    long number;
    uint64_t args[6];
    uint64_t sp;
    uint64_t pc;
} stallmon_syscall_view;

/// Reads `/proc/self/task/<tid>/syscall` with one open, read and close; no allocation. "running"
/// and "-1 sp pc" (blocked, but not in a system call) are both state 1.
void stallmon_read_syscall(pid_t tid, stallmon_syscall_view *out);

/// 1 when `number` is epoll_wait, epoll_pwait or epoll_pwait2 on this architecture.
int stallmon_syscall_is_epoll_wait(long number);

// MARK: - schedstat

/// The three fields of `schedstat`.
typedef struct {
    uint64_t cpu_ns;   ///< time on a CPU
    uint64_t wait_ns;  ///< time runnable but waiting for a CPU (on a run queue)
    uint64_t runs;     ///< times put on a CPU: while it stays the same, the thread has not run
} stallmon_schedstat;

/// Reads thread `tid`'s `schedstat`: 0, or -1 when it cannot be read (no CONFIG_SCHED_INFO).
int stallmon_read_schedstat(pid_t tid, stallmon_schedstat *out);

/// The same from a `schedstat` file kept open (stallmon_thread_file_open): one `pread`, no
/// allocation.
int stallmon_pread_schedstat(int descriptor, stallmon_schedstat *out);

// MARK: - status

/// Reads field `name` (without its colon) of thread `tid`'s `status` as a number in `base` (16
/// for the signal masks SigPnd, SigBlk, …; 10 for voluntary_ctxt_switches, Seccomp, TracerPid, …):
/// 1 with `*value` set, 0 when the file has no such field, -1 when the file cannot be read or the
/// field holds no number.
int stallmon_read_status_field(pid_t tid, const char *name, int base, uint64_t *value);

#ifdef __cplusplus
}
#endif

#endif  // STALLMON_LINUX
#endif
