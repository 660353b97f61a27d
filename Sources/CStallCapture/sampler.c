// Sampling a thread's own stack from a signal handler.
//
// The watchdog queues a signal to the stalled thread with rt_tgsigqueueinfo, carrying a slot index
// and a generation. The handler (async-signal-safe: no allocation, no locks, errno preserved)
// claims the slot with a compare-and-swap, unwinds from its ucontext with libunwind's local
// unwinder into the slot's preallocated frames, and posts a semaphore. The watchdog waits for that
// post with a timeout; when it gives up it abandons the slot with the same compare-and-swap, so a
// handler that runs late finds nothing to write into.

#define _GNU_SOURCE
#define UNW_LOCAL_ONLY
#include "stallcapture.h"

#include <errno.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <libunwind.h>

enum { SLOT_COUNT = 32 };

enum {
    SLOT_FREE = 0,      // not claimed by any monitor
    SLOT_IDLE = 1,      // claimed, no request outstanding
    SLOT_REQUESTED = 2, // signal sent, handler not yet run
    SLOT_WRITING = 3,   // handler is unwinding into it
    SLOT_DONE = 4,      // handler finished
    SLOT_ABANDONED = 5, // watchdog stopped waiting
};

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
    uint64_t enter_ns;
    uint64_t exit_ns;
    uintptr_t frames[STALLMON_MAX_FRAMES];
    sem_t done;
} slot_t;

static slot_t slots[SLOT_COUNT];
static _Atomic int slots_initialized;
static _Atomic int installed_signals[65];

static inline uint64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
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

void stallmon_sample_thread(int index, pid_t tid, int signo, int max_frames, uint64_t timeout_ns,
                            stallmon_sample *out) {
    memset(out, 0, offsetof(stallmon_sample, frames));
    if (index < 0 || index >= SLOT_COUNT) {
        out->status = STALLMON_SAMPLE_NO_SLOT;
        return;
    }
    slot_t *slot = &slots[index];
    if (max_frames <= 0 || max_frames > STALLMON_MAX_FRAMES) max_frames = STALLMON_MAX_FRAMES;
    if (atomic_load(&slot->broken)) {
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

    out->handler_enter_ns = slot->enter_ns;
    out->handler_exit_ns = slot->exit_ns;
    out->truncated = slot->truncated;
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
