// The loop-latency histogram: allocation and the readers' side (see latency.h for the writer's).

#include "latency.h"

#if defined(STALLMON_LINUX)

#include <stdlib.h>
#include <string.h>

stallmon_latency *stallmon_latency_create(void) {
    stallmon_latency *latency = aligned_alloc(64, (sizeof(stallmon_latency) + 63) / 64 * 64);
    if (latency == NULL) return NULL;
    for (int i = 0; i < STALLMON_LATENCY_BUCKETS; i++) atomic_init(&latency->counts[i], 0);
    atomic_init(&latency->sum_ns, 0);
    return latency;
}

void stallmon_latency_free(stallmon_latency *latency) { free(latency); }

void stallmon_latency_record(stallmon_latency *latency, uint64_t ns) { stallmon_latency_add(latency, ns); }

uint64_t stallmon_latency_read(const stallmon_latency *latency, uint64_t *counts) {
    for (int i = 0; i < STALLMON_LATENCY_BUCKETS; i++) {
        counts[i] = atomic_load_explicit(&latency->counts[i], memory_order_relaxed);
    }
    return atomic_load_explicit(&latency->sum_ns, memory_order_relaxed);
}

int stallmon_latency_bucket(uint64_t ns) { return (int)stallmon_latency_index(ns); }

uint64_t stallmon_latency_bucket_upper_ns(int index) {
    if (index <= 0) return 1024;
    if (index >= STALLMON_LATENCY_BUCKETS - 1) return UINT64_MAX;
    uint32_t exponent = 10 + (uint32_t)(index - 1) / 4;
    uint64_t quarter = (uint64_t)((index - 1) % 4);
    return (4 + quarter + 1) << (exponent - 2);
}

#endif  // STALLMON_LINUX
