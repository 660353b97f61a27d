#ifndef STALLBENCH_H
#define STALLBENCH_H

#include "stallmon_platform.h"
#include <stdint.h>
#include <sys/types.h>

// The benchmark's own system calls that Swift cannot make: perf_event_open and bpf have no glibc
// wrapper, and syscall(2) is variadic. Outside Linux (and under STALLMON_PRETEND_NON_LINUX) every
// function fails with -ENOSYS.

/// A perf event that counts the returns of the epoll waits (`epoll_wait`, `epoll_pwait`,
/// `epoll_pwait2`) on thread `tid` alone, from now on: the `raw_syscalls/sys_exit` tracepoint (its id,
/// from `/sys/kernel/tracing/events/raw_syscalls/sys_exit/id`) with a filter on the system call's
/// number. Not `syscalls/sys_exit_epoll_wait` and its kin: while a BPF program is attached to one of
/// those (the tick watcher's), the kernel hands a hit to its perf events only when the program
/// returns 1, and the tick watcher's return 0. Returns its descriptor, or -errno. The corresponding
/// C functions are `perf_event_open` and `ioctl` (PERF_EVENT_IOC_SET_FILTER, PERF_EVENT_IOC_ENABLE).
int stallbench_wait_counter(pid_t tid, uint64_t raw_sys_exit);

/// The count of a counter from stallbench_wait_counter, or -errno.
int64_t stallbench_counter_read(int descriptor);

/// Turns on the kernel's run-time statistics of BPF programs (`run_time_ns`, `run_cnt`) while the
/// returned descriptor stays open, or -errno. The corresponding C call is `bpf(BPF_ENABLE_STATS)`.
int stallbench_bpf_enable_run_time_stats(void);

/// The id of the loaded BPF program after `after` (0: the first), 0 when there is none, or -errno.
int64_t stallbench_bpf_next_program(uint32_t after);

/// Program `id`'s name (at most 15 characters and a NUL), and the time its runs took and their
/// count since it was loaded (counted while statistics are on). Returns 0, or -errno.
int stallbench_bpf_program_stats(uint32_t id, char name[16], uint64_t *run_time_ns, uint64_t *run_count);

#endif
