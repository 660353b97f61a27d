#ifndef STALLMON_BLOCKED_H
#define STALLMON_BLOCKED_H

// Inside CStallCapture: a stalled thread in a system call (blocked.c), for the sampler (sampler.c).

#include "stallcapture.h"

#if defined(STALLMON_LINUX)

#include <stdint.h>
#include <sys/types.h>

/// What the watchdog last saw of one thread out of blocking calls (see stallmon_blocked_may_signal):
/// its run count and voluntary context switches, read just before a look that saw it running.
/// `tid` 0: no entry.
typedef struct {
    pid_t tid;
    uint64_t runs;
    uint64_t switches;
} stallmon_quiet_thread;

/// Threads of one slot with an entry of their own: the loops of a large event loop group.
enum { STALLMON_QUIET_COUNT = 64 };

/// What one slot (one watchdog) keeps of the threads it samples, owned by the watchdog.
typedef struct {
    // The latest stack unwound from the kernel's view: while the thread has not run since, its
    // stack has not changed.
    struct {
        int valid;
        pid_t tid;
        long view[9];  // system call, arguments, sp, pc
        uint64_t runs;
        int max_frames, count, truncated, recovered;
        uintptr_t frames[STALLMON_MAX_FRAMES];
    } kernel;
    // For each thread the slot samples (the loops of a group share their watchdog's slot).
    stallmon_quiet_thread quiet[STALLMON_QUIET_COUNT];
    unsigned quiet_next;  // the entry a thread not yet in the table replaces
} stallmon_blocked_state;

/// `view` gets the system call, its six arguments, sp and pc. Returns 1 when the thread sits in a
/// system call, 0 when it runs (or blocks outside one, as in a page fault), -1 when unreadable.
int stallmon_read_syscall_view(pid_t tid, long view[9]);

/// Whether a signal may go to thread `tid` now: 1 (send), 0 (do not send) or 2 (blocked in a
/// system call now: `view`). See blocked.c.
int stallmon_blocked_may_signal(stallmon_blocked_state *blocked, pid_t tid, long view[9]);

/// Notes that thread `tid` was seen out of blocking calls (its counts now).
void stallmon_blocked_note_running(stallmon_blocked_state *blocked, pid_t tid);

/// Unwinds a thread that blocks in the system call `view` shows, in place (see blocked.c).
void stallmon_blocked_sample(stallmon_blocked_state *blocked, pid_t tid, const long view[9], int max_frames,
                             stallmon_sample *out);

/// Forgets every thread: the slot is released.
void stallmon_blocked_forget(stallmon_blocked_state *blocked);

#endif
#endif
