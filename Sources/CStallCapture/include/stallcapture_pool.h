#ifndef STALLMON_STALLCAPTURE_POOL_H
#define STALLMON_STALLCAPTURE_POOL_H

// Swift's cooperative pool (the global concurrent executor): each job a pool thread runs is timed,
// so that a job that holds its thread past a threshold is reported like a stalled loop.

#include "stallmon_platform.h"

#if defined(STALLMON_LINUX)

#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/// Pool threads that can be timed at once; a thread beyond them runs its jobs untimed (counted).
enum { STALLMON_POOL_MAX_THREADS = 256 };

/// Called on a pool thread from inside a task made with `priority` (a probe) on the runtime's global
/// concurrent queue of that priority: checks the runtime's Job layout on that task against the
/// runtime's own answers (see ``stallmon_pool_layout_problem``), then remembers that queue, so that
/// jobs of that priority can be enqueued on it through the trampoline. Returns 1 when learned, 0
/// when the job does not run on a queue of the runtime's (another global executor is installed),
/// STALLMON_POOL_LAYOUT_MISMATCH when the layout differs (the hook is then never set, or comes off).
int stallmon_pool_learn_queue(unsigned priority);
enum { STALLMON_POOL_LAYOUT_MISMATCH = -1 };

/// 1 once a probe found the runtime's layout as the hook and the request table read it, and none
/// found it otherwise; 0 before, and for good after a mismatch.
int stallmon_pool_layout_verified(void);
/// Why the layout was refused, naming the check, what was expected and what was found; NULL while
/// no check failed. Checks: `task-id` (swift_task_getJobTaskId against the words at 36 and 0x90),
/// `job-kind` (0 at 32 for a task), `priority` (the probe's at 33), `queue-kind` (1 at 24, written
/// by the runtime's enqueue on its global executor), `invoke` (metadata+24 in
/// libswift_Concurrency.so's code).
const char *stallmon_pool_layout_problem(void);
/// For tests only: makes the check named `check` (as above) find a value other than the runtime's,
/// so that the next probes refuse the layout. Call before the monitor starts. Returns 0, or -EINVAL
/// for an unknown name.
int stallmon_pool_simulate_layout_mismatch(const char *check);

/// 1 when the queue of `priority` is known.
int stallmon_pool_knows_priority(unsigned priority);

/// Sets `swift_task_enqueueGlobal_hook`: each job of a known priority is then enqueued on the
/// runtime's own queue for it through a trampoline that times the job on its thread. Returns 0,
/// -ENOENT when the runtime has no such hook, -EPROTO while the runtime's layout is not verified
/// (``stallmon_pool_layout_verified``), -EBUSY when someone else's hook is set.
int stallmon_pool_install(void);
/// Clears the hook again (when it is ours). Jobs already enqueued still run through the trampoline.
void stallmon_pool_uninstall(void);
/// 1 while the hook is ours.
int stallmon_pool_installed(void);
/// 1 while someone else's hook is set (SwiftNIO's event loops as the global executor, say).
int stallmon_pool_hook_taken(void);

/// The job a pool thread runs now, as the watchdog reads it.
typedef struct {
    pid_t tid;           ///< 0: no thread holds the slot
    uint64_t sequence;   ///< jobs the slot's thread has started
    uint64_t start_ns;   ///< CLOCK_MONOTONIC start of the running job; 0 between jobs
} stallmon_pool_job;

/// Slots ever claimed (the watchdog reads slots below it).
int stallmon_pool_slot_count(void);
/// Reads slot `index` consistently. Returns 1, or 0 while the thread is between two stores (read again).
int stallmon_pool_read(int index, stallmon_pool_job *out);
/// The job the pool thread `tid` runs now (for a task's job, the task itself), or 0 when it runs
/// none or is no pool thread.
uintptr_t stallmon_pool_job_of_thread(pid_t tid);
/// When the latest job of pool thread `tid` that the watchdog watched as a stall ended
/// (CLOCK_MONOTONIC), if that job ran at `at_ns`; else 0.
uint64_t stallmon_pool_stall_end_of_thread(pid_t tid, uint64_t at_ns);
/// Asks the thread in slot `index` to record the end of job `sequence` (0 stops watching).
void stallmon_pool_watch(int index, uint64_t sequence);
/// When job `sequence` of slot `index` has ended and its end was recorded, stores it and returns 1.
int stallmon_pool_watched_end(int index, uint64_t sequence, uint64_t *end_ns);

/// Jobs enqueued untimed because their priority's queue is unknown, and threads past the slots.
uint64_t stallmon_pool_untimed_jobs(void);
uint64_t stallmon_pool_untimed_threads(void);
/// The priority of the latest job enqueued untimed for want of its queue (0x100 | priority), or 0.
unsigned stallmon_pool_latest_unknown_priority(void);

/// For benchmarks: runs `jobs` empty jobs on the calling thread, through the trampoline
/// (`timed` 1, as the hook enqueues them) or by their invoke call alone (`timed` 0, as the runtime
/// runs them), and returns the nanoseconds per job.
double stallmon_pool_measure_job_ns(long jobs, int timed);

// MARK: - The watchdog's wait

/// Announces that the watchdog is about to wait without a timeout; afterwards the watchdog reads
/// every slot again and waits only if all are between jobs. A job that starts afterwards wakes it.
/// Returns 1, or -1 when membarrier(2) was refused after registration: then the watchdog must not
/// wait without a timeout this once.
int stallmon_pool_park(void);
/// Withdraws the announcement (a job was running after all).
void stallmon_pool_unpark(void);
/// Waits until a job wakes the parked watchdog, ``stallmon_pool_wake`` is called, or `timeout_ns`
/// passes (UINT64_MAX: without limit). Returns 1 when woken, 0 after a timeout.
int stallmon_pool_wait(uint64_t timeout_ns);
/// Wakes the watchdog (to stop it).
void stallmon_pool_wake(void);

#ifdef __cplusplus
}
#endif

#endif  // STALLMON_LINUX

#endif
