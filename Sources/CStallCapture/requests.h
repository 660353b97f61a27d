#ifndef STALLMON_REQUESTS_H
#define STALLMON_REQUESTS_H

// Inside CStallCapture: the Swift runtime's current task, and the pool hook's call into the
// request table (requests.c).

#include "stallcapture_requests.h"

#include <stdatomic.h>
#include <stdint.h>

#if defined(STALLMON_LINUX)

/// The task running on the calling thread (a thread-local load in libswift_Concurrency), NULL
/// outside a task. Weak: a program without Swift concurrency has none.
extern void *swift_task_getCurrent(void) __attribute__((weak, swiftcall));

/// Called as `job` is enqueued on the cooperative pool: when the enqueuing task serves a request,
/// `job` serves it too.
void stallmon_request_inherit(void *job);

/// Whether the runtime's Job layout has been checked against the runtime itself and found as this
/// code reads it (pool_layout.c, stallmon_pool_check_layout): 0 before the check, and for good
/// after a mismatch. Until it is 1, nothing reads a job's or task's memory. One relaxed load:
/// state 1 is set once, before the hook that makes anything read a job, and never again.
extern _Atomic int stallmon_runtime_layout_state;
static inline int stallmon_runtime_layout_verified(void) {
    return atomic_load_explicit(&stallmon_runtime_layout_state, memory_order_acquire) == 1;
}

/// The ID (its low 32 bits) of `task`, which the caller knows to live: its own current task, a job
/// being enqueued or started. 0 when the layout is not verified (unknown).
static inline uint32_t stallmon_live_task_id(const void *task) {
    return stallmon_runtime_layout_verified() ? *(const uint32_t *)((const char *)task + 36) : 0;
}

/// The ID of the task `job` that a pool thread runs now, as the trampoline read it when the job
/// started (the task lived then): 1 with `*id` set, 0 when no pool thread runs it (or it is no
/// task). The request table's lookups take a task's ID from here, never from its memory.
int stallmon_pool_running_task_id(uintptr_t job, uint32_t *id);

#endif
#endif
