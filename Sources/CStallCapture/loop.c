// Observer callouts: the only stallmon code on the monitored loop's hot path.
//
// Each callout reads CLOCK_MONOTONIC once (vDSO) and publishes one event into a small ring with
// relaxed stores and one release store. Only a transition out of an idle phase also checks whether
// the watchdog is parked and, if so, wakes it; a busy loop therefore never pays for a fence or a
// wakeup, and an idle loop costs the watchdog nothing.

#include "stallcapture.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

// CFRunLoopActivity values (CFRunLoop.h).
enum {
    ACTIVITY_ENTRY = 1UL << 0,
    ACTIVITY_BEFORE_SOURCES = 1UL << 2,
    ACTIVITY_BEFORE_WAITING = 1UL << 5,
    ACTIVITY_AFTER_WAITING = 1UL << 6,
    ACTIVITY_EXIT = 1UL << 7,
};

enum { RING_SIZE = 16, MAX_DEPTH = 32 };

typedef struct {
    _Atomic uint64_t timestamp_ns;
    _Atomic uint64_t info;  // phase | window << 8 | depth << 16 | allowed << 40
} ring_entry;

struct stallmon_loop {
    // Written by the monitored thread.
    _Atomic uint64_t sequence;
    ring_entry ring[RING_SIZE];
    _Atomic uint32_t allowed;
    // Owned by the monitored thread (never read elsewhere).
    uint32_t phase;
    uint32_t depth;
    uint32_t window_at_depth[MAX_DEPTH];
    // Shared with the watchdog; written rarely, so the observer's reads stay cache hits.
    _Atomic int parked __attribute__((aligned(64)));
    _Atomic uint64_t watch_sequence;
    _Atomic uint64_t watch_end_ns;
    _Atomic uint64_t watch_end_sequence;
    stallmon_wake_fn wake;
    void *wake_context;
    stallmon_release_fn release;
    _Atomic long references;
};

static inline uint64_t clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

uint64_t stallmon_now_ns(void) { return clock_ns(CLOCK_MONOTONIC); }
uint64_t stallmon_boottime_ns(void) { return clock_ns(CLOCK_BOOTTIME); }
pid_t stallmon_gettid(void) { return (pid_t)syscall(SYS_gettid); }

void stallmon_set_timer_slack(unsigned long nanoseconds) { prctl(PR_SET_TIMERSLACK, nanoseconds, 0, 0, 0); }

int64_t stallmon_thread_cpu_ns(pid_t tid) {
    // The kernel's per-thread CPU clock id (MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)):
    // valid for any thread of the calling process.
    clockid_t clock = (clockid_t)((~(unsigned)tid << 3) | 4 | 2);
    struct timespec ts;
    if (clock_gettime(clock, &ts) != 0) return -1;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int stallmon_sigrtmin(void) { return SIGRTMIN; }
int stallmon_sigrtmax(void) { return SIGRTMAX; }

stallmon_loop *stallmon_loop_create(stallmon_wake_fn wake, void *wake_context, stallmon_release_fn release) {
    stallmon_loop *loop = aligned_alloc(64, (sizeof(stallmon_loop) + 63) / 64 * 64);
    if (loop == NULL) return NULL;
    atomic_init(&loop->sequence, 0);
    for (int i = 0; i < RING_SIZE; i++) {
        atomic_init(&loop->ring[i].timestamp_ns, 0);
        atomic_init(&loop->ring[i].info, 0);
    }
    atomic_init(&loop->allowed, 0);
    loop->phase = STALLMON_LOOP_UNKNOWN;
    loop->depth = 0;
    for (int i = 0; i < MAX_DEPTH; i++) loop->window_at_depth[i] = STALLMON_WINDOW_BEFORE_SOURCES;
    atomic_init(&loop->parked, 0);
    atomic_init(&loop->watch_sequence, 0);
    atomic_init(&loop->watch_end_ns, 0);
    atomic_init(&loop->watch_end_sequence, 0);
    loop->wake = wake;
    loop->wake_context = wake_context;
    loop->release = release;
    atomic_init(&loop->references, 1);
    return loop;
}

const void *stallmon_loop_retain(const void *pointer) {
    stallmon_loop *loop = (stallmon_loop *)pointer;
    atomic_fetch_add_explicit(&loop->references, 1, memory_order_relaxed);
    return pointer;
}

void stallmon_loop_release(const void *pointer) {
    stallmon_loop *loop = (stallmon_loop *)pointer;
    if (atomic_fetch_sub_explicit(&loop->references, 1, memory_order_acq_rel) != 1) return;
    if (loop->release != NULL) loop->release(loop->wake_context);
    free(loop);
}

void stallmon_loop_watch(stallmon_loop *loop, uint64_t sequence) {
    atomic_store_explicit(&loop->watch_sequence, sequence, memory_order_seq_cst);
}

int stallmon_loop_watched_end(const stallmon_loop *loop, uint64_t sequence, uint64_t *end_ns) {
    // The observer writes the end, then its sequence; only one end is ever written per watch.
    if (atomic_load_explicit(&loop->watch_end_sequence, memory_order_acquire) != sequence) return 0;
    *end_ns = atomic_load_explicit(&loop->watch_end_ns, memory_order_relaxed);
    return 1;
}

static inline void publish(stallmon_loop *loop, uint32_t phase, uint32_t window) {
    uint64_t sequence = atomic_load_explicit(&loop->sequence, memory_order_relaxed) + 1;
    int watched = atomic_load_explicit(&loop->watch_sequence, memory_order_relaxed) == sequence - 1;
    // Only the start of a window, and the end of a window the watchdog is sampling, need the time:
    // idle transitions skip the clock (timestamp 0), which is most of a sleeping loop's callouts.
    uint64_t now = phase == STALLMON_LOOP_ACTIVE || watched ? clock_ns(CLOCK_MONOTONIC) : 0;
    if (__builtin_expect(watched, 0)) {
        // The watchdog is sampling a stall of the window that this transition ends.
        atomic_store_explicit(&loop->watch_end_ns, now, memory_order_relaxed);
        atomic_store_explicit(&loop->watch_end_sequence, sequence - 1, memory_order_release);
    }
    uint64_t allowed = atomic_load_explicit(&loop->allowed, memory_order_relaxed);
    ring_entry *entry = &loop->ring[sequence % RING_SIZE];
    // Orders the entry's stores after the publication of every earlier sequence, so that a reader
    // that validates an entry against `sequence` never accepts a half-overwritten one (a compiler
    // barrier on x86, a real fence on weaker machines).
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&entry->timestamp_ns, now, memory_order_relaxed);
    atomic_store_explicit(&entry->info,
                          (uint64_t)phase | (uint64_t)window << 8 | (uint64_t)loop->depth << 16 | allowed << 40,
                          memory_order_relaxed);
    atomic_store_explicit(&loop->sequence, sequence, memory_order_release);

    uint32_t previous = loop->phase;
    loop->phase = phase;
    if (phase == STALLMON_LOOP_ACTIVE && previous != STALLMON_LOOP_ACTIVE) {
        // Leaving an idle phase: the watchdog may be parked. Pairs with the fence in stallmon_loop_park.
        atomic_thread_fence(memory_order_seq_cst);
        if (atomic_load_explicit(&loop->parked, memory_order_relaxed) &&
            atomic_exchange_explicit(&loop->parked, 0, memory_order_acq_rel)) {
            loop->wake(loop->wake_context);
        }
    }
}

void stallmon_observer_window_start(void *observer, uintptr_t activity, void *info) {
    (void)observer;
    stallmon_loop *loop = info;
    if (loop == NULL) return;  // CFRunLoopObserverInvalidate clears info while a callout may be on its way
    uint32_t window;
    if (activity & ACTIVITY_AFTER_WAITING) {
        window = STALLMON_WINDOW_AFTER_WAITING;
    } else if (activity & ACTIVITY_BEFORE_SOURCES) {
        window = STALLMON_WINDOW_BEFORE_SOURCES;
    } else {  // entry: the pass is heading into its sources
        if (loop->depth < UINT32_MAX) loop->depth += 1;
        window = STALLMON_WINDOW_BEFORE_SOURCES;
    }
    // A monitor started inside a running loop never saw that run's entry: count it now, so that
    // a nested run's exit does not look like the outermost one.
    if (loop->depth == 0) loop->depth = 1;
    if (loop->depth < MAX_DEPTH) loop->window_at_depth[loop->depth] = window;
    publish(loop, STALLMON_LOOP_ACTIVE, window);
}

void stallmon_observer_window_end(void *observer, uintptr_t activity, void *info) {
    (void)observer;
    stallmon_loop *loop = info;
    if (loop == NULL) return;
    if (activity & ACTIVITY_BEFORE_WAITING) {
        publish(loop, STALLMON_LOOP_ASLEEP, STALLMON_WINDOW_NONE);
        return;
    }
    // Exit. A nested run returning hands control back to the callout that started it: the outer
    // window resumes, and since the nested run made progress, it resumes as a fresh window.
    if (loop->depth > 0) loop->depth -= 1;
    if (loop->depth > 0) {
        uint32_t window = loop->depth < MAX_DEPTH ? loop->window_at_depth[loop->depth] : STALLMON_WINDOW_BEFORE_SOURCES;
        publish(loop, STALLMON_LOOP_ACTIVE, window);
    } else {
        publish(loop, STALLMON_LOOP_OUTSIDE, STALLMON_WINDOW_NONE);
    }
}

static void decode(uint64_t sequence, uint64_t timestamp, uint64_t info, stallmon_event *out) {
    out->sequence = sequence;
    out->timestamp_ns = timestamp;
    out->phase = (uint32_t)(info & 0xff);
    out->window = (uint32_t)((info >> 8) & 0xff);
    out->depth = (uint32_t)((info >> 16) & 0xffffff);
    out->allowed = (uint32_t)(info >> 40);
}

// Reads the entry for `sequence`; returns 0 when it was overwritten while (or before) reading.
static int read_entry(const stallmon_loop *loop, uint64_t sequence, stallmon_event *out) {
    const ring_entry *entry = &loop->ring[sequence % RING_SIZE];
    uint64_t timestamp = atomic_load_explicit(&entry->timestamp_ns, memory_order_relaxed);
    uint64_t info = atomic_load_explicit(&entry->info, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    uint64_t newest = atomic_load_explicit(&loop->sequence, memory_order_relaxed);
    // The writer fills entry `newest + 1` before publishing it, so that slot may be torn.
    if (newest + 1 - sequence >= RING_SIZE) return 0;
    decode(sequence, timestamp, info, out);
    return 1;
}

int stallmon_loop_latest(const stallmon_loop *loop, stallmon_event *out) {
    for (;;) {
        uint64_t sequence = atomic_load_explicit(&loop->sequence, memory_order_acquire);
        if (sequence == 0) return 0;
        if (read_entry(loop, sequence, out)) return 1;
    }
}

int stallmon_loop_event_after(const stallmon_loop *loop, uint64_t sequence, stallmon_event *out) {
    uint64_t newest = atomic_load_explicit(&loop->sequence, memory_order_acquire);
    if (newest <= sequence) return 0;
    return read_entry(loop, sequence + 1, out) ? 1 : -1;
}

int stallmon_loop_park(stallmon_loop *loop, uint64_t seen_sequence) {
    atomic_store_explicit(&loop->parked, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&loop->sequence, memory_order_relaxed) == seen_sequence) return 1;
    // The loop moved on. If its callout already took the park flag, a wake is on its way.
    return atomic_exchange_explicit(&loop->parked, 0, memory_order_acq_rel) ? 0 : 1;
}

int stallmon_loop_unpark(stallmon_loop *loop) {
    return atomic_exchange_explicit(&loop->parked, 0, memory_order_acq_rel) ? 0 : 1;
}

void stallmon_loop_allow_begin(stallmon_loop *loop) {
    atomic_fetch_add_explicit(&loop->allowed, 1, memory_order_relaxed);
}

void stallmon_loop_allow_end(stallmon_loop *loop) {
    uint32_t before = atomic_load_explicit(&loop->allowed, memory_order_relaxed);
    if (before == 0) return;  // unbalanced end: ignore
    // The fresh window is published before the scope closes, so that the watchdog never sees the
    // old window without the scope.
    if (loop->phase == STALLMON_LOOP_ACTIVE) {
        uint32_t window = loop->depth < MAX_DEPTH ? loop->window_at_depth[loop->depth] : STALLMON_WINDOW_BEFORE_SOURCES;
        publish(loop, STALLMON_LOOP_ACTIVE, window);
    }
    atomic_store_explicit(&loop->allowed, before - 1, memory_order_relaxed);
}

uint32_t stallmon_loop_allowed(const stallmon_loop *loop) {
    return atomic_load_explicit(&loop->allowed, memory_order_relaxed);
}
