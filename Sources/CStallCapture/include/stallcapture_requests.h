#ifndef STALLMON_STALLCAPTURE_REQUESTS_H
#define STALLMON_STALLCAPTURE_REQUESTS_H

// The requests in flight: which span of swift-distributed-tracing the work of a task or thread
// serves, so that a watchdog can name the request of a stalled thread. A span registers itself
// when it starts, under the task it starts in (or its thread, outside a task), and withdraws when
// it ends; the watchdog looks the stalled thread's task up. No allocation: a fixed table of slots
// claimed with a compare-and-swap; each slot's lock is held only to copy what its span says.

#include "stallmon_platform.h"

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

/// A registration number: a slot's owners count up from 1, in STALLMON_REQUEST_NUMBER_BITS bits
/// (a span keeps its number in a word with more), and round to 1 past them; an alias's link keeps
/// the low STALLMON_REQUEST_SEQUENCE_BITS bits of its owner's (never all 0).
enum { STALLMON_REQUEST_NUMBER_BITS = 43, STALLMON_REQUEST_SEQUENCE_BITS = 18 };

/// A registration found: its slot, registration number and depth.
typedef struct {
    int32_t slot;
    uint32_t depth;
    uint64_t sequence;
} stallmon_request_found;

/// Takes a slot for a span under `key`, inside `depth` spans of its task or thread: returns it and
/// writes its registration number to `*sequence` and the slot's storage to `*parts` (NULL until
/// the caller sets it), or returns -1 when the table is full near the key. The caller keeps what
/// the span says in that storage: it writes it now, without the slot's lock (free when this
/// returns, and no reader looks at an unpublished slot), then publishes the registration. A span
/// under a task keeps the task's ID: once another task lives at the address (a span the first
/// never ended), the registration is no longer found, and its slot is reclaimed by the next span
/// of that address.
int stallmon_request_register(uint64_t key, uint32_t depth, uint64_t *sequence, void **parts);
/// A span's start in the calling task or thread, in one call: writes its key to `*key`, and the
/// span its task serves now (as stallmon_request_find finds it) to `*around`, slot -1 when there
/// is none (outside a task: a thread's spans are no parents); then registers the span under the
/// key, inside that one, as stallmon_request_register does.
int stallmon_request_register_current(uint64_t *key, stallmon_request_found *around, uint64_t *sequence,
                                      void **parts);
void stallmon_request_publish(int slot, uint64_t sequence);
/// Withdraws registration `sequence` of `slot`: 1, or 0 when it is withdrawn already (a copy of
/// the span ended it).
int stallmon_request_withdraw(int slot, uint64_t sequence);

/// The registration serving the first of `keys` that has one: 1 with `*found` filled, else 0. A
/// registration under a key itself is preferred to one the key inherited, and the deepest to the
/// others (the innermost span). What it says is read under the slot's lock, where the caller checks
/// that the slot still holds that registration. No task's memory is read: a task key's ID comes
/// from the caller's own task or from the pool thread that runs it (stamped as its job started),
/// and where neither has it, registrations under the address are taken whatever task made them.
int stallmon_request_find(const uint64_t *keys, int count, stallmon_request_found *found);
/// As stallmon_request_find, for one key whose task's ID the caller read while the task surely
/// lived (0: unknown, as for a thread's key): a registration or alias made for another task at that
/// address is not found.
int stallmon_request_find_task(uint64_t key, uint32_t task_id, stallmon_request_found *found);

/// The storage the caller keeps for `slot` (set once, by the first span in the slot; never freed),
/// or NULL.
void *stallmon_request_parts(int slot);
void stallmon_request_set_parts(int slot, void *parts);
/// IDs for a new span, never 0, from the calling thread's generator (seeded from getrandom once per
/// thread): its trace's (`high`, `low`; unless NULL) and its own.
void stallmon_request_new_ids(uint64_t *high, uint64_t *low, uint64_t *span);
/// The slot's lock, over its parts while published: held for the copies of a few values.
void stallmon_request_lock(int slot);
void stallmon_request_unlock(int slot);
/// Locks `slot` and returns its storage if it holds registration `sequence`; else returns NULL,
/// unlocked.
void *stallmon_request_lock_held(int slot, uint64_t sequence);

/// The calls of wrapped tracers' spans, by number (StallMonitorTracing's `SpanCalls`): each set
/// once, before any span names it. A span keeps the number; a load finds them, where a Swift global
/// would be reached through its initializer's check on every call of the span.
enum { STALLMON_SPAN_CALLS = 16 };
extern void *stallmon_span_calls[STALLMON_SPAN_CALLS];
static inline void *stallmon_span_calls_numbered(uint64_t number) {
    return stallmon_span_calls[number % STALLMON_SPAN_CALLS];
}
void stallmon_span_calls_set(uint64_t number, void *calls);

/// What the pool hook does for a job `job` enqueued by the work of key `current` (for tests): a
/// task's key inherits, a thread's does not (the hook sees no task there).
void stallmon_request_inherit_for(uint64_t current, uint64_t job);

/// For benchmarks: what the pool hook adds to the enqueue of `jobs` jobs (distinct, never run)
/// made by the work of `current` (a key that serves a request, or 0: the calling thread's task, as
/// the hook sees it), in nanoseconds per job.
double stallmon_request_measure_inherit_ns(long jobs, uint64_t current);

/// 1 once any span has registered (the lookups do nothing before).
int stallmon_request_used(void);
/// Looks whether a task's span is open now, when one may be: 0 when none is (the pool hook, which
/// inherits from tasks only, then does nothing until the next task's span starts), else 1. One
/// load while the word says none may be open, or while another sweep looks; else a pass over the
/// table, which stops at the first open span (a whole pass when none is: 9 µs from the caches,
/// more from memory). Safe from any thread, and from several at once. Called by the cooperative
/// pool's watchdog on wakeups it makes anyway.
int stallmon_request_sweep(void);
/// 1 while a task's span may be open (one has started since a sweep last found none open), else 0.
int stallmon_request_may_be_open(void);
/// Sweeps that looked at the table since start.
uint64_t stallmon_request_sweeps(void);
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
