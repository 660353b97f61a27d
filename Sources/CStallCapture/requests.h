#ifndef STALLMON_REQUESTS_H
#define STALLMON_REQUESTS_H

// Inside CStallCapture: the Swift runtime's current task, and the pool hook's call into the
// request table (requests.c).

#include "stallcapture_requests.h"

#if defined(STALLMON_LINUX)

/// The task running on the calling thread (a thread-local load in libswift_Concurrency), NULL
/// outside a task. Weak: a program without Swift concurrency has none.
extern void *swift_task_getCurrent(void) __attribute__((weak, swiftcall));

/// Called as `job` is enqueued on the cooperative pool: when the enqueuing task serves a request,
/// `job` serves it too.
void stallmon_request_inherit(void *job);

#endif
#endif
