#ifndef STALLMON_LATENCY_INTERNAL_H
#define STALLMON_LATENCY_INTERNAL_H

// The loop-latency histogram's hot path, shared by the run-loop observer (loop.c) and the tick
// counter (ticks.c). One writer per histogram (the loop's thread) and readers that never lock:
// each count is a relaxed load and a relaxed store (no locked instruction, no read-modify-write
// that another writer could race), so a reader sees every count it reads whole and never
// smaller than before.

#include "stallcapture.h"

#if defined(STALLMON_LINUX)

#include <stdatomic.h>
#include <stdint.h>

struct stallmon_latency {
    _Atomic uint64_t counts[STALLMON_LATENCY_BUCKETS];
    _Atomic uint64_t sum_ns;
};

// Log-linear buckets: below 1024 ns one bucket, then four a power of two (each a quarter of its
// octave wide, so a bucket's upper bound is at most 25 % above any value in it), up to 2^36 ns
// (68.7 s); longer windows share the last bucket.
static inline uint32_t stallmon_latency_index(uint64_t ns) {
    if (ns < 1024) return 0;
    uint32_t exponent = 63 - (uint32_t)__builtin_clzll(ns);  // 10 and up
    uint32_t index = 1 + (exponent - 10) * 4 + (uint32_t)((ns >> (exponent - 2)) & 3);
    return index < STALLMON_LATENCY_BUCKETS ? index : STALLMON_LATENCY_BUCKETS - 1;
}

static inline void stallmon_latency_add(stallmon_latency *latency, uint64_t ns) {
    _Atomic uint64_t *count = &latency->counts[stallmon_latency_index(ns)];
    atomic_store_explicit(count, atomic_load_explicit(count, memory_order_relaxed) + 1, memory_order_relaxed);
    atomic_store_explicit(&latency->sum_ns, atomic_load_explicit(&latency->sum_ns, memory_order_relaxed) + ns,
                          memory_order_relaxed);
}

#endif  // STALLMON_LINUX

#endif
