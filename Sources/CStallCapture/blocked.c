// A stalled thread seen in a system call, for the sampler (sampler.c): whether a signal may go to
// the thread now (stallmon_blocked_may_signal, asked before each send: a signal would end a
// nanosleep, poll or epoll_wait with EINTR), and its stack unwound in place from the sp and pc the
// kernel shows (stallmon_blocked_sample), the latest unwind reused while the thread has not run
// since. The thread's /proc files are read and parsed by threadview.c.
//
// Runs on the watchdog thread only, never in the sampling signal's handler; the state it keeps
// (stallmon_blocked_state) lives in the watchdog's slot and is the watchdog's alone.

#define _GNU_SOURCE
#include "blocked.h"
#include "stallcapture_threadview.h"
#include "unwind.h"

#if defined(STALLMON_LINUX)

#include <errno.h>
#include <string.h>
#include <time.h>

/// `view` gets the system call, its six arguments, sp and pc. Returns 1 when the thread sits in a
/// system call, 0 when it runs (or blocks outside one, as in a page fault), -1 when unreadable.
int stallmon_read_syscall_view(pid_t tid, long view[9]) {
    stallmon_syscall_view seen;
    stallmon_read_syscall(tid, &seen);
    if (seen.state != 0) return seen.state == 1 ? 0 : -1;
    view[0] = seen.number;
    for (int i = 0; i < 6; i++) view[1 + i] = (long)seen.args[i];
    view[7] = (long)seen.sp;
    view[8] = (long)seen.pc;
    return 1;
}

/// Times the thread has been put on a CPU (schedstat): while it stays the same, the thread has not
/// run.
static int read_runs(pid_t tid, uint64_t *runs) {
    stallmon_schedstat schedstat;
    if (stallmon_read_schedstat(tid, &schedstat) != 0) return -1;
    *runs = schedstat.runs;
    return 0;
}

/// Voluntary context switches of the thread: how often it has blocked.
static int read_voluntary_switches(pid_t tid, uint64_t *switches) {
    return stallmon_read_status_field(tid, "voluntary_ctxt_switches", 10, switches) == 1 ? 0 : -1;
}

/// One look at the thread: its system call view, between two reads of its CPU clock. Returns 1
/// when the clock moved, that is when the thread was on a CPU while it was looked at.
static int look(pid_t tid, long view[9], int *state) {
    int64_t before = stallmon_thread_cpu_ns(tid);
    *state = stallmon_read_syscall_view(tid, view);
    int64_t after = stallmon_thread_cpu_ns(tid);
    return before >= 0 && after > before;
}

static void pause_microseconds(long microseconds) {
    struct timespec pause = {.tv_sec = 0, .tv_nsec = microseconds * 1000};
    while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {}
}

/// The thread's quiet entry, or NULL.
static stallmon_quiet_thread *quiet_entry(stallmon_blocked_state *blocked, pid_t tid) {
    if (tid <= 0) return NULL;
    for (int i = 0; i < STALLMON_QUIET_COUNT; i++) {
        if (blocked->quiet[i].tid == tid) return &blocked->quiet[i];
    }
    return NULL;
}

/// Records that the thread was seen out of blocking calls with these counts (in its entry, or in
/// a new one that replaces the oldest).
static void remember_quiet(stallmon_blocked_state *blocked, pid_t tid, uint64_t runs, uint64_t switches) {
    stallmon_quiet_thread *entry = quiet_entry(blocked, tid);
    if (entry == NULL) entry = &blocked->quiet[blocked->quiet_next++ % STALLMON_QUIET_COUNT];
    *entry = (stallmon_quiet_thread){.tid = tid, .runs = runs, .switches = switches};
}

/// Whether a signal may go to the thread now. /proc says "running" for any runnable thread: one
/// preempted inside a system call before it sleeps, or woken in one and waiting for a CPU, would
/// take the signal there. So the thread is looked at with its CPU clock read around the look (up
/// to three times, 100 µs apart), and:
///   - on a CPU, and not switched in since the previous look that found it out of blocking calls
///     (its schedstat run count): it never left the CPU, and is signalled;
///   - otherwise its voluntary context switches decide: unchanged since that look, it was only
///     preempted, and is signalled (even when no look caught it on a CPU: it may then sit
///     preempted inside a system call's entry, the residual risk);
///   - changed (or no such look): it is watched for 200 µs, and signalled only if it did not block
///     again and has run since (switched in, or seen on a CPU), that is left the call it blocked
///     in. A thread that keeps blocking in short system calls runs between them often enough for a
///     signal to land in the next one: it is not signalled.
/// The counters are read before each look. Returns 1 (send), 0 (do not send) or 2 (blocked in a
/// system call now: `view`).
int stallmon_blocked_may_signal(stallmon_blocked_state *blocked, pid_t tid, long view[9]) {
    stallmon_quiet_thread *quiet = quiet_entry(blocked, tid);
    int known = quiet != NULL;
    // Without schedstat (no CONFIG_SCHED_INFO), runs read as 0 and only the switches decide.
    uint64_t runs = 0, switches = 0;
    int have_runs = 0, ran_throughout = 0, state = -1, on_cpu = 0;
    for (int attempt = 0; attempt < 3 && !on_cpu; attempt++) {
        if (attempt > 0) pause_microseconds(100);
        have_runs = read_runs(tid, &runs) == 0;
        ran_throughout = have_runs && known && runs == quiet->runs;
        on_cpu = look(tid, view, &state);
        if (state == 1) return 2;
        if (state != 0) return 1;  // no /proc view: nothing more to go on
    }
    // Not switched in since the previous look and on a CPU now: it never left the CPU. (Runnable
    // but not on a CPU, it may have blocked and been woken since, and wait inside a system call.)
    if (ran_throughout && on_cpu) return 1;
    // Preempted, or blocked and woken? The switches (in the larger status file) tell, read before
    // one more look.
    if (read_voluntary_switches(tid, &switches) != 0) return 1;  // cannot tell
    on_cpu = look(tid, view, &state) || on_cpu;
    if (state == 1) return 2;
    if (state != 0) return 1;
    if (known && switches == quiet->switches) {
        quiet->runs = runs;  // only preempted since a look that saw it out of blocking calls
        return 1;
    }
    // It blocked since (or there was no such look): watch it. It is out of that call once it has
    // been switched in again, or is seen on a CPU, without blocking again.
    pause_microseconds(200);
    uint64_t later_runs = 0, later;
    if (read_voluntary_switches(tid, &later) != 0 || (have_runs && read_runs(tid, &later_runs) != 0)) {
        return stallmon_read_syscall_view(tid, view) == 1 ? 2 : 0;
    }
    on_cpu = look(tid, view, &state);
    if (state == 1) return 2;
    int ran_since = have_runs && later_runs != runs;
    if (later != switches || state != 0 || !(ran_since || on_cpu)) return 0;
    remember_quiet(blocked, tid, later_runs, later);
    return 1;
}

void stallmon_blocked_note_running(stallmon_blocked_state *blocked, pid_t tid) {
    uint64_t runs = 0, switches;
    long view[9];
    if (read_voluntary_switches(tid, &switches) != 0) return;
    if (read_runs(tid, &runs) != 0) runs = 0;
    if (stallmon_read_syscall_view(tid, view) != 0) return;
    remember_quiet(blocked, tid, runs, switches);
}

/// Unwinds a thread that blocks in the system call `view` shows, from the kernel's sp and pc.
/// The stack counts only when the thread is in the same call with the same arguments and
/// registers after the unwind as before: its callers' frames, which the unwind read, are then the
/// same. It is reused while the thread has not run since (same count of runs).
void stallmon_blocked_sample(stallmon_blocked_state *blocked, pid_t tid, const long first_view[9], int max_frames,
                             stallmon_sample *out) {
    long view[9];
    memcpy(view, first_view, sizeof view);
    out->source = STALLMON_STACK_KERNEL;
    for (int attempt = 0; attempt < 3; attempt++) {
        out->syscall = view[0];
        uint64_t runs = 0;
        int counted = read_runs(tid, &runs) == 0;
        if (counted && blocked->kernel.valid && blocked->kernel.tid == tid && blocked->kernel.runs == runs &&
            blocked->kernel.max_frames == max_frames && memcmp(blocked->kernel.view, view, sizeof view) == 0) {
            out->status = STALLMON_SAMPLE_OK;
            out->reused = 1;
            out->frame_count = blocked->kernel.count;
            out->truncated = blocked->kernel.truncated;
            out->recovered_frame_pointers = blocked->kernel.recovered;
            memcpy(out->frames, blocked->kernel.frames, sizeof(uintptr_t) * (size_t)blocked->kernel.count);
            return;
        }
        int count = 0, truncated = 0, recovered = 0;
        int rc = stallmon_unwind_blocked((uintptr_t)view[7], (uintptr_t)view[8], max_frames, out->frames, &count,
                                         &truncated, &recovered);
        long after[9];
        int unchanged = stallmon_read_syscall_view(tid, after) == 1 && memcmp(after, view, sizeof view) == 0;
        if (unchanged) {
            if (rc != 0) {
                out->status = STALLMON_SAMPLE_BLOCKED_UNWIND_FAILED;
                out->error = rc;
                blocked->kernel.valid = 0;
                return;
            }
            out->status = STALLMON_SAMPLE_OK;
            out->frame_count = count;
            out->truncated = truncated;
            out->recovered_frame_pointers = recovered;
            blocked->kernel.valid = counted;
            blocked->kernel.tid = tid;
            memcpy(blocked->kernel.view, view, sizeof view);
            blocked->kernel.runs = runs;
            blocked->kernel.max_frames = max_frames;
            blocked->kernel.count = count;
            blocked->kernel.truncated = truncated;
            blocked->kernel.recovered = recovered;
            memcpy(blocked->kernel.frames, out->frames, sizeof(uintptr_t) * (size_t)count);
            return;
        }
        // The thread moved on while it was unwound: look again while it still blocks.
        if (stallmon_read_syscall_view(tid, view) != 1) break;
    }
    out->status = STALLMON_SAMPLE_BLOCKED_UNWIND_FAILED;
    out->error = EAGAIN;
    out->frame_count = 0;
}

void stallmon_blocked_forget(stallmon_blocked_state *blocked) {
    blocked->kernel.valid = 0;
    memset(blocked->quiet, 0, sizeof blocked->quiet);
    blocked->quiet_next = 0;
}

#endif  // STALLMON_LINUX
