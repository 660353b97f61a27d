#ifndef STALLMON_POOL_H
#define STALLMON_POOL_H

// Inside CStallCapture: the Swift runtime's Job as the pool's hook reads it (pool.c), and the check
// of that layout against the runtime (pool_layout.c).

#include "stallcapture_pool.h"

#if defined(STALLMON_LINUX)

#include <stdint.h>

// The runtime's Job (Swift 6.3): the class metadata pointer at 0, SchedulerPrivate[2] at 16 (the
// second says which dispatch queue kind runs it: 1 is the global executor), Flags at 32 with the
// kind in bits 0-7 (0: a task) and the priority in bits 8-15, the ID at 36 (a task's low half; the
// high half at 0x90). The metadata's invoke function (at 24) runs the job, called with (job, NULL,
// 0). All of it is checked by stallmon_pool_check_layout before the hook is set.
enum {
    JOB_DISPATCH_QUEUE_OFFSET = 24,
    JOB_FLAGS_OFFSET = 32,
    JOB_PRIORITY_OFFSET = 33,
    TASK_ID_HIGH_OFFSET = 0x90,
    METADATA_INVOKE_OFFSET = 24,
    DISPATCH_QUEUE_GLOBAL_EXECUTOR = 1,
    PRIORITY_COUNT = 34,  // the runtime's own bound on a job's priority
};
// The runtime's answer: a job's ID (a task's whole 64-bit ID). Weak: without it nothing is installed.
extern uint64_t swift_task_getJobTaskId(void *job) __attribute__((weak, swiftcall));

/// The pool's trampoline: runs `job` timed (pool.c).
void stallmon_pool_run_job(void *job);

/// Checks the words of the running probe task `task` (a job the runtime itself enqueued on its
/// global executor, of `priority`) against the runtime. Returns 1, or 0 after the mismatch was
/// kept and the hook taken off.
int stallmon_pool_check_layout(void *task, unsigned priority);

#endif
#endif
