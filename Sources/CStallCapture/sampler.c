// Sampling a thread's own stack from a signal handler.
//
// The watchdog queues a signal to the stalled thread with rt_tgsigqueueinfo, carrying a slot index
// and a generation. The handler (async-signal-safe: no allocation, no locks, errno preserved)
// claims the slot with a compare-and-swap, unwinds from its ucontext with libunwind's local
// unwinder into the slot's preallocated frames, and posts a semaphore. The watchdog waits for that
// post with a timeout; when it gives up it abandons the slot with the same compare-and-swap, so a
// handler that runs late finds nothing to write into.
//
// A signal handler ends some system calls with EINTR whatever SA_RESTART says (nanosleep, poll,
// epoll_wait, select, timed waits: signal(7)). So a thread that /proc/self/task/<tid>/syscall shows
// inside a system call is not signalled: remote_unwind.c unwinds it in place from the stack
// pointer and program counter the kernel shows. And the signal is sent only while its disposition
// is still stallmon's handler: a program that reset it to SIG_DFL would be killed by it, one that
// ignores it or handles it itself would lose it or run its own code.

#define _GNU_SOURCE
#define UNW_LOCAL_ONLY
#include "stallcapture.h"

#if defined(STALLMON_LINUX)

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <libunwind.h>

#include "requests.h"

enum { SLOT_COUNT = 32 };

enum {
    SLOT_FREE = 0,      // not claimed by any monitor
    SLOT_IDLE = 1,      // claimed, no request outstanding
    SLOT_REQUESTED = 2, // signal sent, handler not yet run
    SLOT_WRITING = 3,   // handler is unwinding into it
    SLOT_DONE = 4,      // handler finished
    SLOT_ABANDONED = 5, // watchdog stopped waiting
};

/// What the watchdog last saw of one thread out of blocking calls (see may_signal): its run count
/// and voluntary context switches, read just before a look that saw it running. `tid` 0: no entry.
typedef struct {
    pid_t tid;
    uint64_t runs;
    uint64_t switches;
} quiet_t;

/// Threads of one slot with a quiet entry of their own: the loops of a large event loop group.
enum { QUIET_COUNT = 64 };

typedef struct {
    _Atomic int state;
    _Atomic uint64_t generation;
    _Atomic pid_t target;
    // Signals queued to the target and handler runs for this slot: while they differ, a signal is
    // still pending (the thread is blocked in the kernel, stopped, or not scheduled), and queueing
    // another would only pile real-time signals up against RLIMIT_SIGPENDING.
    _Atomic uint64_t sent;
    _Atomic uint64_t delivered;
    // Set when a handler that claimed the slot never finished (see stallmon_sample_thread).
    _Atomic int broken;
    int max_frames;
    int frame_count;
    int truncated;
    int unwind_error;
    int interrupted;  // the handler found that it had ended a system call with EINTR
    uintptr_t task;   // the Swift task the thread ran (swift_task_getCurrent), 0 outside a task
    uint64_t enter_ns;
    uint64_t exit_ns;
    uintptr_t frames[STALLMON_MAX_FRAMES];
    sem_t done;
    // The latest stack unwound from the kernel's view, owned by the watchdog: while the thread
    // has not run since, its stack has not changed.
    struct {
        int valid;
        pid_t tid;
        long view[9];  // system call, arguments, sp, pc
        uint64_t runs;
        int max_frames, count, truncated, recovered;
        uintptr_t frames[STALLMON_MAX_FRAMES];
    } kernel;
    // For each thread the slot samples (the loops of a group share their watchdog's slot).
    quiet_t quiet[QUIET_COUNT];
    unsigned quiet_next;  // the entry a thread not yet in the table replaces
} slot_t;

static slot_t slots[SLOT_COUNT];
static _Atomic int slots_initialized;
static _Atomic int installed_signals[65];

static inline uint64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/// Whether the signal ended a system call with EINTR: the kernel returns to the instruction after
/// the system call with -EINTR in the result register (a call it restarts goes back to the
/// instruction itself instead).
static int interrupted_system_call(void *context) {
    const ucontext_t *uc = context;
#if defined(__x86_64__)
    if ((long long)uc->uc_mcontext.gregs[REG_RAX] != -EINTR) return 0;
    const unsigned char *ip = (const unsigned char *)(uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    return ip[-2] == 0x0f && ip[-1] == 0x05;  // syscall
#elif defined(__aarch64__)
    if ((long long)uc->uc_mcontext.regs[0] != -EINTR) return 0;
    const uint32_t *pc = (const uint32_t *)(uintptr_t)uc->uc_mcontext.pc;
    return pc[-1] == 0xd4000001;  // svc #0
#else
    (void)uc;
    return 0;
#endif
}

static void sample_handler(int signo, siginfo_t *info, void *context) {
    (void)signo;
    int saved_errno = errno;
    if (info == NULL || info->si_code != SI_QUEUE || info->si_pid != getpid()) goto out;

    uint64_t token = (uint64_t)(uintptr_t)info->si_value.sival_ptr;
    unsigned index = (unsigned)(token & 0xff);
    if (index >= SLOT_COUNT) goto out;
    slot_t *slot = &slots[index];
    atomic_fetch_add_explicit(&slot->delivered, 1, memory_order_relaxed);
    if (atomic_load_explicit(&slot->generation, memory_order_acquire) != (token >> 8)) goto out;
    if (atomic_load_explicit(&slot->target, memory_order_relaxed) != (pid_t)syscall(SYS_gettid)) goto out;
    int expected = SLOT_REQUESTED;
    if (!atomic_compare_exchange_strong(&slot->state, &expected, SLOT_WRITING)) goto out;

    slot->enter_ns = monotonic_ns();
    slot->frame_count = 0;
    slot->truncated = 0;
    slot->unwind_error = 0;
    unw_cursor_t cursor;
    int rc = unw_init_local2(&cursor, (unw_context_t *)context, UNW_INIT_SIGNAL_FRAME);
    if (rc != 0) {
        slot->unwind_error = rc;
    } else {
        int count = 0;
        for (;;) {
            unw_word_t ip = 0;
            if (unw_get_reg(&cursor, UNW_REG_IP, &ip) < 0 || ip == 0) break;
            if (count == slot->max_frames) {
                slot->truncated = 1;
                break;
            }
            slot->frames[count++] = (uintptr_t)ip;
            if (unw_step(&cursor) <= 0) break;
        }
        slot->frame_count = count;
    }
    slot->interrupted = interrupted_system_call(context);
    // A thread-local load in the Swift runtime: which request the interrupted work serves.
    slot->task = swift_task_getCurrent != NULL ? (uintptr_t)swift_task_getCurrent() : 0;
    slot->exit_ns = monotonic_ns();
    atomic_store_explicit(&slot->state, SLOT_DONE, memory_order_release);
    sem_post(&slot->done);
out:
    errno = saved_errno;
}

static void initialize_slots(void) {
    int expected = 0;
    if (atomic_load(&slots_initialized) == 2) return;
    if (atomic_compare_exchange_strong(&slots_initialized, &expected, 1)) {
        for (int i = 0; i < SLOT_COUNT; i++) {
            atomic_init(&slots[i].state, SLOT_FREE);
            atomic_init(&slots[i].generation, 0);
            atomic_init(&slots[i].target, 0);
            atomic_init(&slots[i].sent, 0);
            atomic_init(&slots[i].delivered, 0);
            atomic_init(&slots[i].broken, 0);
            sem_init(&slots[i].done, 0, 0);
        }
        // A per-thread cache keeps libunwind's lookups lock-free inside the handler.
        unw_set_caching_policy(unw_local_addr_space, UNW_CACHE_PER_THREAD);
        atomic_store(&slots_initialized, 2);
    } else {
        while (atomic_load(&slots_initialized) != 2) sched_yield();
    }
}

int stallmon_signal_disposition(int signo) {
    struct sigaction current;
    if (sigaction(signo, NULL, &current) != 0) return -1;
    if (current.sa_flags & SA_SIGINFO) {
        return current.sa_sigaction == sample_handler ? STALLMON_DISPOSITION_OURS : STALLMON_DISPOSITION_FOREIGN;
    }
    if (current.sa_handler == SIG_DFL) return STALLMON_DISPOSITION_DEFAULT;
    if (current.sa_handler == SIG_IGN) return STALLMON_DISPOSITION_IGNORED;
    return STALLMON_DISPOSITION_FOREIGN;
}

int stallmon_signal_in_use(int signo) {
    struct sigaction current;
    if (sigaction(signo, NULL, &current) != 0) return 1;
    if (current.sa_flags & SA_SIGINFO) return current.sa_sigaction != sample_handler;
    return current.sa_handler != SIG_DFL;
}

int stallmon_sampler_install(int signo) {
    if (signo <= 0 || signo > 64) return -EINVAL;
    initialize_slots();
    if (atomic_load(&installed_signals[signo])) return 0;
    if (stallmon_signal_in_use(signo)) {
        struct sigaction current;
        sigaction(signo, NULL, &current);
        if (!((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == sample_handler)) return -EBUSY;
    }
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = sample_handler;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (sigaction(signo, &action, NULL) != 0) return -errno;
    atomic_store(&installed_signals[signo], 1);
    return 0;
}

int stallmon_sampler_slot_claim(void) {
    initialize_slots();
    for (int i = 0; i < SLOT_COUNT; i++) {
        if (atomic_load(&slots[i].broken)) continue;
        int expected = SLOT_FREE;
        if (atomic_compare_exchange_strong(&slots[i].state, &expected, SLOT_IDLE)) {
            // Signals of a previous owner that never arrived must not block this one.
            atomic_store(&slots[i].delivered, atomic_load(&slots[i].sent));
            return i;
        }
    }
    return -1;
}

void stallmon_sampler_slot_release(int index) {
    if (index < 0 || index >= SLOT_COUNT) return;
    slot_t *slot = &slots[index];
    // A request still outstanding is abandoned first, so a late handler writes nothing.
    int expected = SLOT_REQUESTED;
    atomic_compare_exchange_strong(&slot->state, &expected, SLOT_ABANDONED);
    atomic_fetch_add(&slot->generation, 1);
    if (atomic_load(&slot->broken)) return;  // a handler is stuck in it: never reuse it
    while (atomic_load(&slot->state) == SLOT_WRITING) sched_yield();
    while (sem_trywait(&slot->done) == 0) {}
    slot->kernel.valid = 0;
    memset(slot->quiet, 0, sizeof slot->quiet);
    slot->quiet_next = 0;
    atomic_store(&slot->state, SLOT_FREE);
}

static int wait_until(sem_t *semaphore, uint64_t deadline_ns) {
    struct timespec deadline = {
        .tv_sec = (time_t)(deadline_ns / 1000000000ULL),
        .tv_nsec = (long)(deadline_ns % 1000000000ULL),
    };
    for (;;) {
        if (sem_clockwait(semaphore, CLOCK_MONOTONIC, &deadline) == 0) return 0;
        if (errno == EINTR) continue;
        return -1;
    }
}

// MARK: - The kernel's view of a blocked thread

/// Reads a small /proc file of thread `tid` of this process into `buffer` (NUL-terminated).
static int read_thread_file(pid_t tid, const char *name, char *buffer, size_t size) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/%s", (int)tid, name);
    int descriptor = open(path, O_RDONLY | O_CLOEXEC);
    if (descriptor < 0) return -1;
    ssize_t count;
    do {
        count = read(descriptor, buffer, size - 1);
    } while (count < 0 && errno == EINTR);
    close(descriptor);
    if (count <= 0) return -1;
    buffer[count] = 0;
    return 0;
}

/// `view` gets the system call, its six arguments, sp and pc. Returns 1 when the thread sits in a
/// system call, 0 when it runs (or blocks outside one, as in a page fault), -1 when unreadable.
static int read_syscall_view(pid_t tid, long view[9]) {
    char text[256];
    if (read_thread_file(tid, "syscall", text, sizeof text) != 0) return -1;
    if (strncmp(text, "running", 7) == 0) return 0;
    // "nr a1 … a6 sp pc", or "-1 sp pc" when blocked outside a system call.
    char *cursor = text;
    view[0] = strtol(cursor, &cursor, 10);
    if (view[0] < 0) return 0;
    for (int i = 1; i < 9; i++) view[i] = (long)strtoull(cursor, &cursor, 0);
    return 1;
}

/// Times the thread has been put on a CPU (the third field of schedstat): while it stays the
/// same, the thread has not run.
static int read_runs(pid_t tid, uint64_t *runs) {
    char text[128];
    if (read_thread_file(tid, "schedstat", text, sizeof text) != 0) return -1;
    char *cursor = text;
    strtoull(cursor, &cursor, 10);
    strtoull(cursor, &cursor, 10);
    char *end;
    *runs = strtoull(cursor, &end, 10);
    return end == cursor ? -1 : 0;
}

/// Voluntary context switches of the thread: how often it has blocked.
static int read_voluntary_switches(pid_t tid, uint64_t *switches) {
    char text[4096];
    if (read_thread_file(tid, "status", text, sizeof text) != 0) return -1;
    static const char field[] = "\nvoluntary_ctxt_switches:";
    const char *found = strstr(text, field);
    if (found == NULL) return -1;
    *switches = strtoull(found + sizeof field - 1, NULL, 10);
    return 0;
}

/// One look at the thread: its system call view, between two reads of its CPU clock. Returns 1
/// when the clock moved, that is when the thread was on a CPU while it was looked at.
static int look(pid_t tid, long view[9], int *state) {
    int64_t before = stallmon_thread_cpu_ns(tid);
    *state = read_syscall_view(tid, view);
    int64_t after = stallmon_thread_cpu_ns(tid);
    return before >= 0 && after > before;
}

static void pause_microseconds(long microseconds) {
    struct timespec pause = {.tv_sec = 0, .tv_nsec = microseconds * 1000};
    while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {}
}

/// The thread's quiet entry in the slot, or NULL.
static quiet_t *quiet_entry(slot_t *slot, pid_t tid) {
    if (tid <= 0) return NULL;
    for (int i = 0; i < QUIET_COUNT; i++) {
        if (slot->quiet[i].tid == tid) return &slot->quiet[i];
    }
    return NULL;
}

/// Records that the thread was seen out of blocking calls with these counts (in its entry, or in
/// a new one that replaces the oldest).
static void remember_quiet(slot_t *slot, pid_t tid, uint64_t runs, uint64_t switches) {
    quiet_t *entry = quiet_entry(slot, tid);
    if (entry == NULL) entry = &slot->quiet[slot->quiet_next++ % QUIET_COUNT];
    *entry = (quiet_t){.tid = tid, .runs = runs, .switches = switches};
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
static int may_signal(slot_t *slot, pid_t tid, long view[9]) {
    quiet_t *quiet = quiet_entry(slot, tid);
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
        return read_syscall_view(tid, view) == 1 ? 2 : 0;
    }
    on_cpu = look(tid, view, &state);
    if (state == 1) return 2;
    int ran_since = have_runs && later_runs != runs;
    if (later != switches || state != 0 || !(ran_since || on_cpu)) return 0;
    remember_quiet(slot, tid, later_runs, later);
    return 1;
}

void stallmon_sampler_note_running(int index, pid_t tid) {
    if (index < 0 || index >= SLOT_COUNT) return;
    slot_t *slot = &slots[index];
    uint64_t runs = 0, switches;
    long view[9];
    if (read_voluntary_switches(tid, &switches) != 0) return;
    if (read_runs(tid, &runs) != 0) runs = 0;
    if (read_syscall_view(tid, view) != 0) return;
    remember_quiet(slot, tid, runs, switches);
}

/// Unwinds a thread that blocks in the system call `view` shows, from the kernel's sp and pc.
/// The stack counts only when the thread is in the same call with the same arguments and
/// registers after the unwind as before: its callers' frames, which the unwind read, are then the
/// same. It is reused while the thread has not run since (same count of runs).
static void sample_blocked(slot_t *slot, pid_t tid, const long first_view[9], int max_frames, stallmon_sample *out) {
    long view[9];
    memcpy(view, first_view, sizeof view);
    out->source = STALLMON_STACK_KERNEL;
    for (int attempt = 0; attempt < 3; attempt++) {
        out->syscall = view[0];
        uint64_t runs = 0;
        int counted = read_runs(tid, &runs) == 0;
        if (counted && slot->kernel.valid && slot->kernel.tid == tid && slot->kernel.runs == runs &&
            slot->kernel.max_frames == max_frames && memcmp(slot->kernel.view, view, sizeof view) == 0) {
            out->status = STALLMON_SAMPLE_OK;
            out->reused = 1;
            out->frame_count = slot->kernel.count;
            out->truncated = slot->kernel.truncated;
            out->recovered_frame_pointers = slot->kernel.recovered;
            memcpy(out->frames, slot->kernel.frames, sizeof(uintptr_t) * (size_t)slot->kernel.count);
            return;
        }
        int count = 0, truncated = 0, recovered = 0;
        int rc = stallmon_unwind_blocked((uintptr_t)view[7], (uintptr_t)view[8], max_frames, out->frames, &count,
                                         &truncated, &recovered);
        long after[9];
        int unchanged = read_syscall_view(tid, after) == 1 && memcmp(after, view, sizeof view) == 0;
        if (unchanged) {
            if (rc != 0) {
                out->status = STALLMON_SAMPLE_BLOCKED_UNWIND_FAILED;
                out->error = rc;
                slot->kernel.valid = 0;
                return;
            }
            out->status = STALLMON_SAMPLE_OK;
            out->frame_count = count;
            out->truncated = truncated;
            out->recovered_frame_pointers = recovered;
            slot->kernel.valid = counted;
            slot->kernel.tid = tid;
            memcpy(slot->kernel.view, view, sizeof view);
            slot->kernel.runs = runs;
            slot->kernel.max_frames = max_frames;
            slot->kernel.count = count;
            slot->kernel.truncated = truncated;
            slot->kernel.recovered = recovered;
            memcpy(slot->kernel.frames, out->frames, sizeof(uintptr_t) * (size_t)count);
            return;
        }
        // The thread moved on while it was unwound: look again while it still blocks.
        if (read_syscall_view(tid, view) != 1) break;
    }
    out->status = STALLMON_SAMPLE_BLOCKED_UNWIND_FAILED;
    out->error = EAGAIN;
    out->frame_count = 0;
}

// MARK: - Sampling

void stallmon_sample_thread(int index, pid_t tid, int signo, int max_frames, uint64_t timeout_ns,
                            stallmon_sample *out) {
    stallmon_sample_stack(index, tid, signo, max_frames, timeout_ns, 0, out);
}

void stallmon_sample_stack(int index, pid_t tid, int signo, int max_frames, uint64_t timeout_ns, int flags,
                           stallmon_sample *out) {
    memset(out, 0, offsetof(stallmon_sample, frames));
    out->syscall = -1;
    if (index < 0 || index >= SLOT_COUNT) {
        out->status = STALLMON_SAMPLE_NO_SLOT;
        return;
    }
    slot_t *slot = &slots[index];
    if (max_frames <= 0 || max_frames > STALLMON_MAX_FRAMES) max_frames = STALLMON_MAX_FRAMES;
    long view[9];

    // A signal the program took over is never sent: SIG_DFL would kill it, SIG_IGN drops it, and
    // a handler of its own would run its code. A thread blocked in a system call can still be
    // unwound in place.
    out->disposition = (flags & STALLMON_SAMPLE_NO_SIGNAL) ? STALLMON_DISPOSITION_OURS
                                                             : stallmon_signal_disposition(signo);
    int spare = (flags & STALLMON_SAMPLE_SPARE_SYSCALLS) != 0;
    if ((flags & STALLMON_SAMPLE_NO_SIGNAL) || out->disposition != STALLMON_DISPOSITION_OURS) {
        if (read_syscall_view(tid, view) == 1) {
            sample_blocked(slot, tid, view, max_frames, out);
        } else {
            out->status = STALLMON_SAMPLE_SIGNAL_TAKEN;
        }
        return;
    }
    if (atomic_load(&slot->broken)) {
        if (spare && read_syscall_view(tid, view) == 1) {
            sample_blocked(slot, tid, view, max_frames, out);
            return;
        }
        out->status = STALLMON_SAMPLE_TIMEOUT;
        out->error = EDEADLK;
        return;
    }
    if (atomic_load_explicit(&slot->target, memory_order_relaxed) != tid) {
        // A signal still pending belongs to the previous thread; it does not hold this one up.
        atomic_store(&slot->delivered, atomic_load(&slot->sent));
    }
    if (atomic_load(&slot->sent) > atomic_load(&slot->delivered)) {
        // The previous signal is still pending: the thread has not run since. Asking again
        // would not be answered any sooner.
        if (spare && read_syscall_view(tid, view) == 1) {
            sample_blocked(slot, tid, view, max_frames, out);
            return;
        }
        out->status = STALLMON_SAMPLE_TIMEOUT;
        out->error = EAGAIN;
        return;
    }

    uint64_t generation = atomic_fetch_add(&slot->generation, 1) + 1;
    atomic_store_explicit(&slot->target, tid, memory_order_relaxed);
    slot->max_frames = max_frames;
    atomic_store_explicit(&slot->state, SLOT_REQUESTED, memory_order_release);

    siginfo_t info;
    memset(&info, 0, sizeof info);
    info.si_signo = signo;
    info.si_code = SI_QUEUE;
    info.si_pid = getpid();
    info.si_uid = getuid();
    info.si_value.sival_ptr = (void *)(uintptr_t)((generation << 8) | (uint64_t)index);

    // A thread that keeps blocking in system calls is not signalled, and the last look comes as
    // close to the signal as it can: a thread in a system call is unwound in place instead. What
    // remains is a thread that ran without blocking since the previous look (or through a 200 µs
    // watch) and enters a system call within the next few microseconds; the handler then reports
    // that it ended it (`interrupted_syscall`).
    if (spare) {
        int verdict = may_signal(slot, tid, view);
        if (verdict != 1) {
            atomic_store(&slot->state, SLOT_IDLE);
            if (verdict == 2) {
                sample_blocked(slot, tid, view, max_frames, out);
            } else {
                out->status = STALLMON_SAMPLE_SYSCALL_BUSY;
            }
            return;
        }
    }
    out->requested_ns = monotonic_ns();
    atomic_fetch_add(&slot->sent, 1);
    if (syscall(SYS_rt_tgsigqueueinfo, getpid(), tid, signo, &info) != 0) {
        out->status = STALLMON_SAMPLE_SEND_FAILED;
        out->error = errno;
        atomic_fetch_sub(&slot->sent, 1);
        atomic_store(&slot->state, SLOT_IDLE);
        return;
    }

    if (wait_until(&slot->done, out->requested_ns + timeout_ns) != 0) {
        int expected = SLOT_REQUESTED;
        if (atomic_compare_exchange_strong(&slot->state, &expected, SLOT_ABANDONED)) {
            out->status = STALLMON_SAMPLE_TIMEOUT;
            atomic_store(&slot->state, SLOT_IDLE);
            return;
        }
        // The handler claimed the slot just in time: it is unwinding and will post shortly. The
        // unwinder walks the loaded images (dl_iterate_phdr); a thread interrupted inside dlopen
        // could keep it from finishing, so even this wait is bounded, and a slot whose handler
        // never finishes is never used again.
        if (wait_until(&slot->done, monotonic_ns() + 1000000000ULL) != 0) {
            atomic_store(&slot->broken, 1);
            out->status = STALLMON_SAMPLE_TIMEOUT;
            out->error = EDEADLK;
            return;
        }
    }

    out->source = STALLMON_STACK_SIGNAL;
    out->handler_enter_ns = slot->enter_ns;
    out->handler_exit_ns = slot->exit_ns;
    out->truncated = slot->truncated;
    out->interrupted_syscall = slot->interrupted;
    out->current_task = slot->task;
    if (slot->unwind_error != 0) {
        out->status = STALLMON_SAMPLE_UNWIND_FAILED;
        out->error = slot->unwind_error;
    } else {
        out->status = STALLMON_SAMPLE_OK;
        out->frame_count = slot->frame_count;
        memcpy(out->frames, slot->frames, sizeof(uintptr_t) * (size_t)slot->frame_count);
    }
    atomic_store(&slot->state, SLOT_IDLE);
}

// MARK: - SIGCONT counting

static _Atomic uint64_t continue_count;
static _Atomic uint64_t continue_time_ns;
static _Atomic int continue_installed;

static void continue_handler(int signo) {
    (void)signo;
    int saved_errno = errno;
    atomic_store_explicit(&continue_time_ns, monotonic_ns(), memory_order_relaxed);
    atomic_fetch_add_explicit(&continue_count, 1, memory_order_release);
    errno = saved_errno;
}

int stallmon_continue_watch_install(void) {
    if (atomic_load(&continue_installed)) return 1;
    struct sigaction current;
    if (sigaction(SIGCONT, NULL, &current) != 0) return 0;
    int ours = !(current.sa_flags & SA_SIGINFO) && current.sa_handler == continue_handler;
    if (ours) return 1;
    if ((current.sa_flags & SA_SIGINFO) || current.sa_handler != SIG_DFL) return 0;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = continue_handler;
    action.sa_flags = SA_RESTART;
    sigemptyset(&action.sa_mask);
    if (sigaction(SIGCONT, &action, NULL) != 0) return 0;
    atomic_store(&continue_installed, 1);
    return 1;
}

uint64_t stallmon_continue_count(void) { return atomic_load_explicit(&continue_count, memory_order_acquire); }
uint64_t stallmon_continue_time_ns(void) { return atomic_load_explicit(&continue_time_ns, memory_order_relaxed); }

#endif  // STALLMON_LINUX
