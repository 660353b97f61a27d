// Tick counting for event loops that report the end of each tick (SwiftNIO). (Whether such a loop
// waits in epoll_wait comes from the kernel's view of its thread, threadview.c; the watchdog's wait
// for it is the io_uring watch, watch.c.)
//
// The loop thread owns `sequence` and `end_ns` and is their only writer: it stores the end with a
// relaxed store and publishes the new sequence with a release store, so a watchdog that sees the
// new sequence (acquire) sees that end or a later one. The watch fields let the watchdog learn
// the exact end of the one tick that ended a stall, however many ticks followed before it looked.

#define _GNU_SOURCE
#include "stallcapture_ticks.h"
#include "latency.h"

#if defined(STALLMON_LINUX)

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct stallmon_ticks {
    _Atomic uint64_t sequence;
    _Atomic uint64_t end_ns;
    // Set by the first tick a metrics delegate counts.
    _Atomic int delegated;
    // Tick durations (NULL when off); set before the loop thread is bound.
    stallmon_latency *latency;
    // Written by the watchdog, rarely: on its own cache line so that the loop's stores above do
    // not bounce it.
    _Atomic uint64_t watch_sequence __attribute__((aligned(64)));
    _Atomic uint64_t watched_end_ns;
};

static __thread stallmon_ticks *bound;

stallmon_ticks *stallmon_ticks_create(void) {
    stallmon_ticks *ticks = NULL;
    if (posix_memalign((void **)&ticks, 64, sizeof *ticks) != 0) return NULL;
    memset(ticks, 0, sizeof *ticks);
    return ticks;
}

void stallmon_ticks_free(stallmon_ticks *ticks) {
    if (ticks != NULL) stallmon_latency_free(ticks->latency);
    free(ticks);
}

int stallmon_ticks_enable_latency(stallmon_ticks *ticks) {
    if (ticks->latency != NULL) return 0;
    ticks->latency = stallmon_latency_create();
    return ticks->latency != NULL ? 0 : -ENOMEM;
}

const stallmon_latency *stallmon_ticks_latency(const stallmon_ticks *ticks) { return ticks->latency; }

void stallmon_ticks_bind(stallmon_ticks *ticks) { bound = ticks; }

static inline void count_tick(stallmon_ticks *ticks, uint64_t end_ns) {
    uint64_t next = atomic_load_explicit(&ticks->sequence, memory_order_relaxed) + 1;
    if (atomic_load_explicit(&ticks->watch_sequence, memory_order_relaxed) == next - 1) {
        // The watchdog waits for the end of this very tick: record it before publishing it.
        atomic_store_explicit(&ticks->watched_end_ns, end_ns, memory_order_relaxed);
    }
    atomic_store_explicit(&ticks->end_ns, end_ns, memory_order_relaxed);
    atomic_store_explicit(&ticks->sequence, next, memory_order_release);
}

void stallmon_tick(uint64_t start_ns, uint64_t end_ns) {
    stallmon_ticks *ticks = bound;
    if (ticks == NULL) return;
    if (ticks->latency != NULL && end_ns >= start_ns) stallmon_latency_add(ticks->latency, end_ns - start_ns);
    if (!atomic_load_explicit(&ticks->delegated, memory_order_relaxed)) {
        atomic_store_explicit(&ticks->delegated, 1, memory_order_relaxed);
    }
    count_tick(ticks, end_ns);
}

void stallmon_ticks_beat(stallmon_ticks *ticks) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    count_tick(ticks, (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec);
}

int stallmon_ticks_delegated(const stallmon_ticks *ticks) {
    return atomic_load_explicit(&ticks->delegated, memory_order_relaxed);
}

uint64_t stallmon_ticks_sequence(const stallmon_ticks *ticks) {
    return atomic_load_explicit(&ticks->sequence, memory_order_acquire);
}

uint64_t stallmon_ticks_latest_end(const stallmon_ticks *ticks) {
    return atomic_load_explicit(&ticks->end_ns, memory_order_relaxed);
}

void stallmon_ticks_watch(stallmon_ticks *ticks, uint64_t sequence) {
    atomic_store_explicit(&ticks->watched_end_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&ticks->watch_sequence, sequence, memory_order_seq_cst);
}

int stallmon_ticks_watched_end(const stallmon_ticks *ticks, uint64_t sequence, uint64_t *end_ns) {
    if (atomic_load_explicit(&ticks->sequence, memory_order_acquire) <= sequence) return 0;
    uint64_t end = atomic_load_explicit(&ticks->watched_end_ns, memory_order_relaxed);
    if (end == 0) return 0;  // the tick ended before the loop saw the watch
    *end_ns = end;
    return 1;
}

#endif  // STALLMON_LINUX
