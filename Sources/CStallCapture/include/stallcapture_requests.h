#ifndef STALLMON_STALLCAPTURE_REQUESTS_H
#define STALLMON_STALLCAPTURE_REQUESTS_H

// The requests in flight: which span of swift-distributed-tracing the work of a task or thread
// serves, so that a watchdog can name the request of a stalled thread. A span registers itself
// when it starts, under the task it starts in (or its thread, outside a task), and withdraws when
// it ends; the watchdog looks the stalled thread's task up. No lock and no allocation: a fixed
// table of slots claimed with a compare-and-swap.

#if defined(__linux__) && !defined(STALLMON_PRETEND_NON_LINUX)
#define STALLMON_LINUX 1
#endif

#if defined(STALLMON_LINUX)

#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/// Slots in the table: requests (and their child tasks) in flight at once; past them a span goes
/// unregistered (counted).
enum { STALLMON_REQUEST_SLOTS = 16384 };

/// The key of the calling context: its Swift task, or its thread outside a task.
uint64_t stallmon_request_current_key(void);
/// The key of thread `tid`, outside a task.
uint64_t stallmon_request_thread_key(pid_t tid);

/// Registers `record` (an object pointer, not retained: the caller withdraws it before the object
/// is freed, in its deinit at the latest) under `key`, inside `depth` spans of its task or thread.
/// Returns the slot, or -1 when the table is full near the key.
int stallmon_request_register(uint64_t key, void *record, uint32_t depth);
/// Withdraws the registration in `slot`. Waits only while a watchdog retains that record at this
/// moment (the time of one retain).
void stallmon_request_withdraw(int slot);

/// The record serving the first of `keys` that has one, retained (+1, for the caller to release),
/// or NULL. A record registered under a key itself is preferred to one the key inherited, and the
/// deepest to the others (the innermost span).
void *stallmon_request_acquire(const uint64_t *keys, int count);

/// 64 random bits from the calling thread's generator (seeded from getrandom once per thread):
/// trace and span IDs, where stallmon makes them.
uint64_t stallmon_request_random(void);

/// What the pool hook does for a job `job` enqueued by the work of key `current` (for tests).
void stallmon_request_inherit_for(uint64_t current, uint64_t job);

/// For benchmarks: what the pool hook adds to the enqueue of `jobs` jobs (distinct, never run)
/// made by the work of `current` (a key that serves a request, or 0: the calling thread's task, as
/// the hook sees it), in nanoseconds per job.
double stallmon_request_measure_inherit_ns(long jobs, uint64_t current);

/// 1 once any span has registered (the lookups and the pool hook do nothing before).
int stallmon_request_used(void);
/// Spans registered now (a pass over the whole table: for tests and diagnostics); spans refused for
/// a full table since start; aliases made by the pool hook.
int64_t stallmon_request_live(void);
uint64_t stallmon_request_refused(void);
uint64_t stallmon_request_inherited(void);

#ifdef __cplusplus
}
#endif

#endif  // STALLMON_LINUX

#endif
