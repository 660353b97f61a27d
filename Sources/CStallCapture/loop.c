// Observer callouts: the only stallmon code on the monitored loop's hot path.
//
// Each callout reads CLOCK_MONOTONIC once (vDSO) and publishes one event into a small ring with
// relaxed stores and one release store. Only a transition out of an idle phase also checks whether
// the watchdog is parked and, if so, wakes it (behind a compiler barrier where membarrier(2) is
// available, a full fence where not); a busy loop never wakes the watchdog, and an idle loop costs
// the watchdog nothing.

#include "stallcapture.h"
#include "latency.h"

#if defined(STALLMON_LINUX)

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <linux/membarrier.h>
#include <sys/syscall.h>

// CFRunLoopActivity values (CFRunLoop.h).
enum {
    ACTIVITY_ENTRY = 1UL << 0,
    ACTIVITY_BEFORE_WAITING = 1UL << 5,
    ACTIVITY_AFTER_WAITING = 1UL << 6,
    ACTIVITY_EXIT = 1UL << 7,
};

enum {
    RING_SIZE = 16,
    // Runs nested deeper than this share the innermost level's window.
    MAX_LEVELS = 32,
};

typedef struct {
    _Atomic uint64_t timestamp_ns;
    _Atomic uint64_t info;  // phase | window << 8 | depth << 16 | allowed << 40
} ring_entry;

struct stallmon_loop {
    // Written by the monitored thread.
    _Atomic uint64_t sequence;
    ring_entry ring[RING_SIZE];
    _Atomic uint32_t allowed;
    // Owned by the monitored thread (never read elsewhere): the runs of the loop on its stack
    // (entries less exits) and the latest window of each, outermost first.
    uint32_t phase;
    uint32_t depth;
    uint32_t level_window[MAX_LEVELS];
    // The window-duration histogram (NULL when off) and the start of the current window, for it.
    stallmon_latency *latency;
    uint64_t window_start_ns;
    // Shared with the watchdog; written rarely, so the observer's reads stay cache hits.
    _Atomic int parked __attribute__((aligned(64)));
    int asymmetric;  // parking uses membarrier, so the observer needs no fence (set at creation)
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


// Parking is a Dekker handshake: the watchdog announces `parked`, then reads the sequence; a
// callout leaving an idle phase stores the sequence, then reads `parked`. Each side needs a full
// fence between its store and its load, or both may miss the other (x86 reorders a store with a
// later load). The callout's side runs on every idle-to-active transition, twice per pass of a
// busy RunLoop.run(); the watchdog's once per idle period. membarrier(2)'s private expedited
// command moves the whole cost to the rare side: it runs a full barrier on every CPU that runs a
// thread of this process, so the callout needs only a compiler barrier. Registered once per
// process; where the kernel or a seccomp filter refuses it, both sides use fences.
static int membarrier_registered(void) {
    static _Atomic int state;  // 0 not tried, 1 registered, -1 unavailable
    int known = atomic_load_explicit(&state, memory_order_acquire);
    if (known != 0) return known > 0;
    long commands = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    int registered = commands >= 0 && (commands & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
                     syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
    atomic_store_explicit(&state, registered ? 1 : -1, memory_order_release);
    return registered;
}

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
    for (int i = 0; i < MAX_LEVELS; i++) loop->level_window[i] = STALLMON_WINDOW_NONE;
    loop->latency = NULL;
    loop->window_start_ns = 0;
    atomic_init(&loop->parked, 0);
    loop->asymmetric = membarrier_registered();
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
    stallmon_latency_free(loop->latency);
    free(loop);
}

int stallmon_loop_enable_latency(stallmon_loop *loop) {
    if (loop->latency != NULL) return 0;
    loop->latency = stallmon_latency_create();
    return loop->latency != NULL ? 0 : -ENOMEM;
}

const stallmon_latency *stallmon_loop_latency(const stallmon_loop *loop) { return loop->latency; }

void stallmon_loop_watch(stallmon_loop *loop, uint64_t sequence) {
    atomic_store_explicit(&loop->watch_sequence, sequence, memory_order_seq_cst);
}

int stallmon_loop_watched_end(const stallmon_loop *loop, uint64_t sequence, uint64_t *end_ns) {
    // The observer writes the end, then its sequence; only one end is ever written per watch.
    if (atomic_load_explicit(&loop->watch_end_sequence, memory_order_acquire) != sequence) return 0;
    *end_ns = atomic_load_explicit(&loop->watch_end_ns, memory_order_relaxed);
    return 1;
}

// The loop-latency histogram's part of a transition (off by default; the callouts' measured form
// of publish()): counts the window that ends at this transition (unless an allowingStall scope
// overlapped it: its time never counts, as for stalls) and notes the start of the next.
// window_start_ns is 0 outside a window. The end needs the time even where the ring's entry goes
// without it.
static inline void record_window(stallmon_loop *loop, uint32_t phase, uint64_t now, uint64_t allowed) {
    uint64_t start = loop->window_start_ns;
    if (start != 0) {
        uint64_t end = now != 0 ? now : clock_ns(CLOCK_MONOTONIC);
        if (allowed == 0) stallmon_latency_add(loop->latency, end - start);
    }
    loop->window_start_ns = phase == STALLMON_LOOP_ACTIVE ? now : 0;
}

// The watchdog announced that it parks: the transition that takes the flag wakes it.
__attribute__((noinline, cold)) static void wake_parked(stallmon_loop *loop) {
    if (atomic_exchange_explicit(&loop->parked, 0, memory_order_acq_rel)) loop->wake(loop->wake_context);
}

// Publishes the entry of transition `sequence` and notes the phase; leaving an idle phase, it wakes
// a parked watchdog.
__attribute__((always_inline)) static inline void store_transition(stallmon_loop *loop, uint32_t phase, uint32_t window,
                                                                   uint64_t now, uint64_t sequence, uint64_t allowed) {
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
    if ((phase == STALLMON_LOOP_ACTIVE && previous != STALLMON_LOOP_ACTIVE) || previous == STALLMON_LOOP_UNKNOWN) {
        // Leaving an idle phase, or the first transition the monitor sees (the watchdog waits for
        // it, whichever phase it is): the watchdog may be parked. Pairs with the barrier in stallmon_loop_park.
        if (loop->asymmetric) {
            atomic_signal_fence(memory_order_seq_cst);
        } else {
            atomic_thread_fence(memory_order_seq_cst);
        }
        if (__builtin_expect(atomic_load_explicit(&loop->parked, memory_order_relaxed), 0)) wake_parked(loop);
    }
}

// A transition that ends a window the watchdog is sampling: the end is read after the watch was
// seen, and is the entry's time too.
__attribute__((noinline, cold)) static void publish_watched(stallmon_loop *loop, uint32_t phase, uint32_t window,
                                                            uint64_t sequence) {
    uint64_t now = clock_ns(CLOCK_MONOTONIC);
    atomic_store_explicit(&loop->watch_end_ns, now, memory_order_relaxed);
    atomic_store_explicit(&loop->watch_end_sequence, sequence - 1, memory_order_release);
    store_transition(loop, phase, window, now, sequence, atomic_load_explicit(&loop->allowed, memory_order_relaxed));
}

// Inlined into each callout, in two forms: `measured` (a constant) for a loop with the histogram
// on, whose callouts take it whole, and without, where what a transition rarely does (the end of a
// watched window, waking the watchdog) is out of line, so that the common path calls nothing but
// the clock of a window's start, read first, with little to keep across it: a transition to an
// idle phase saves no register at all (callgrind: about 50 instructions a busy pass fewer than with
// the rare paths inline). Each callout checks for the histogram first and leaves for its measured
// form by a tail call.
__attribute__((always_inline)) static inline void publish(stallmon_loop *loop, uint32_t phase, uint32_t window,
                                                          int measured) {
    if (measured) {
        uint64_t sequence = atomic_load_explicit(&loop->sequence, memory_order_relaxed) + 1;
        int watched = atomic_load_explicit(&loop->watch_sequence, memory_order_relaxed) == sequence - 1;
        uint64_t now = phase == STALLMON_LOOP_ACTIVE || watched ? clock_ns(CLOCK_MONOTONIC) : 0;
        if (__builtin_expect(watched, 0)) {
            atomic_store_explicit(&loop->watch_end_ns, now, memory_order_relaxed);
            atomic_store_explicit(&loop->watch_end_sequence, sequence - 1, memory_order_release);
        }
        uint64_t allowed = atomic_load_explicit(&loop->allowed, memory_order_relaxed);
        record_window(loop, phase, now, allowed);
        store_transition(loop, phase, window, now, sequence, allowed);
        return;
    }
    // Only the start of a window, and the end of a window the watchdog is sampling, need the time:
    // idle transitions skip the clock (timestamp 0), which is most of a sleeping loop's callouts.
    uint64_t now = phase == STALLMON_LOOP_ACTIVE ? clock_ns(CLOCK_MONOTONIC) : 0;
    uint64_t sequence = atomic_load_explicit(&loop->sequence, memory_order_relaxed) + 1;
    if (__builtin_expect(atomic_load_explicit(&loop->watch_sequence, memory_order_relaxed) == sequence - 1, 0)) {
        publish_watched(loop, phase, window, sequence);
        return;
    }
    store_transition(loop, phase, window, now, sequence, atomic_load_explicit(&loop->allowed, memory_order_relaxed));
}

// publish() for a transition outside the callouts, which checks for the histogram itself.
static void publish_any(stallmon_loop *loop, uint32_t phase, uint32_t window) {
    if (loop->latency != NULL) {
        publish(loop, phase, window, 1);
    } else {
        publish(loop, phase, window, 0);
    }
}

// Windows and nesting. The window-start observer sees kCFRunLoopEntry, kCFRunLoopBeforeTimers and
// kCFRunLoopAfterWaiting at the lowest order, so everything a run does from its entry on is inside
// a window: the entry and before-timers observers of others (RunLoop.run() enters the loop on
// every pass, and both run before the sources), the before-sources observers, sources, blocks and
// the main queue. Before-timers opens the window of every pass, where before-sources did: nothing
// but observers runs between the two, and a mode observed on both would pay two dispatches. Entry
// costs one CF observer dispatch a run, and buys nesting that needs nothing of CoreFoundation's
// layout: every run the observers see is entered and exited through them, so the depth is a count.

static inline uint32_t level_index(uint32_t depth) { return (depth < MAX_LEVELS ? depth : MAX_LEVELS) - 1; }

__attribute__((always_inline)) static inline void window_start(stallmon_loop *loop, uintptr_t activity, int measured) {
    uint32_t window = (activity & ACTIVITY_AFTER_WAITING) ? STALLMON_WINDOW_AFTER_WAITING : STALLMON_WINDOW_BEFORE_SOURCES;
    if (activity & ACTIVITY_ENTRY) {
        loop->depth++;
    } else if (loop->depth == 0) {
        // A monitor started inside a run sees its windows without its entry: it counts as the
        // outermost run from here on (its exit pops nothing it did not push). If a callout of
        // that run nests a run, that run's exit leaves the rest of the callout unwatched.
        loop->depth = 1;
    }
    loop->level_window[level_index(loop->depth)] = window;
    publish(loop, STALLMON_LOOP_ACTIVE, window, measured);
}

__attribute__((noinline)) static void window_start_measured(stallmon_loop *loop, uintptr_t activity) {
    window_start(loop, activity, 1);
}

void stallmon_observer_window_start(void *observer, uintptr_t activity, void *info) {
    (void)observer;
    stallmon_loop *loop = info;
    if (loop == NULL) return;  // CFRunLoopObserverInvalidate clears info while a callout may be on its way
    if (__builtin_expect(loop->latency != NULL, 0)) {
        window_start_measured(loop, activity);
        return;
    }
    window_start(loop, activity, 0);
}

// The exit of a nested run: the outer window resumes, and since the nested run made progress, as a
// fresh window. Out of line, so that the window end's common paths read no clock.
__attribute__((noinline)) static void resume_outer_window(stallmon_loop *loop) {
    publish_any(loop, STALLMON_LOOP_ACTIVE, loop->level_window[level_index(loop->depth)]);
}

__attribute__((always_inline)) static inline void window_end(stallmon_loop *loop, uintptr_t activity, int measured) {
    if (activity & ACTIVITY_BEFORE_WAITING) {
        publish(loop, STALLMON_LOOP_ASLEEP, STALLMON_WINDOW_NONE, measured);
        return;
    }
    // Exit: the innermost run returns to the callout that started it, or leaves the loop.
    if (loop->depth > 0) loop->depth--;
    if (loop->depth > 0) {
        resume_outer_window(loop);
    } else {
        publish(loop, STALLMON_LOOP_OUTSIDE, STALLMON_WINDOW_NONE, measured);
    }
}

__attribute__((noinline)) static void window_end_measured(stallmon_loop *loop, uintptr_t activity) {
    window_end(loop, activity, 1);
}

void stallmon_observer_window_end(void *observer, uintptr_t activity, void *info) {
    (void)observer;
    stallmon_loop *loop = info;
    if (loop == NULL) return;
    if (__builtin_expect(loop->latency != NULL, 0)) {
        window_end_measured(loop, activity);
        return;
    }
    window_end(loop, activity, 0);
}

// A drain that runs the loop itself (the light drain of an async main) is one run, never nested
// in its own callouts: one level, whose windows all come after waiting.
__attribute__((always_inline)) static inline void drain_window_start(stallmon_loop *loop, int measured) {
    loop->depth = 1;
    loop->level_window[level_index(1)] = STALLMON_WINDOW_AFTER_WAITING;
    publish(loop, STALLMON_LOOP_ACTIVE, STALLMON_WINDOW_AFTER_WAITING, measured);
}

__attribute__((noinline)) static void drain_window_start_measured(stallmon_loop *loop) { drain_window_start(loop, 1); }

void stallmon_loop_drain_window_start(stallmon_loop *loop) {
    if (__builtin_expect(loop->latency != NULL, 0)) {
        drain_window_start_measured(loop);
        return;
    }
    drain_window_start(loop, 0);
}

__attribute__((noinline)) static void drain_window_end_measured(stallmon_loop *loop) {
    publish(loop, STALLMON_LOOP_ASLEEP, STALLMON_WINDOW_NONE, 1);
}

void stallmon_loop_drain_window_end(stallmon_loop *loop) {
    if (__builtin_expect(loop->latency != NULL, 0)) {
        drain_window_end_measured(loop);
        return;
    }
    publish(loop, STALLMON_LOOP_ASLEEP, STALLMON_WINDOW_NONE, 0);
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
    if (loop->asymmetric && syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0) {
        // Registered, yet refused (a seccomp filter installed since): the callout's transitions
        // cannot be seen for sure, so never wait without a timeout.
        return atomic_exchange_explicit(&loop->parked, 0, memory_order_acq_rel) ? -1 : 1;
    }
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
        uint32_t window = loop->depth > 0 ? loop->level_window[level_index(loop->depth)] : STALLMON_WINDOW_BEFORE_SOURCES;
        publish_any(loop, STALLMON_LOOP_ACTIVE, window);
    }
    atomic_store_explicit(&loop->allowed, before - 1, memory_order_relaxed);
}

uint32_t stallmon_loop_allowed(const stallmon_loop *loop) {
    return atomic_load_explicit(&loop->allowed, memory_order_relaxed);
}

#else

// No real-time signals here: glibc's numbers on Linux, which the configuration is written for.
int stallmon_sigrtmin(void) { return 34; }
int stallmon_sigrtmax(void) { return 64; }
#endif  // STALLMON_LINUX
