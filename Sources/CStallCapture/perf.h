#ifndef STALLMON_PERF_H
#define STALLMON_PERF_H

// Inside CStallCapture: a perf event on one stalled thread (perf.c), used by the sampler.

#include "stallcapture.h"

#if defined(STALLMON_LINUX)

#include <stdint.h>
#include <sys/types.h>

typedef struct {
    int descriptor;  // -1: none open
    void *ring;
    pid_t tid;
    uint64_t period_ns;
    int first_period;  // the short first period is still set
} stallmon_perf_event;

void stallmon_perf_event_init(stallmon_perf_event *event);
/// Opens a task-clock event on thread `tid` of this process and maps its ring: 0, or -1 (the
/// kernel's refusal is kept, stallmon_perf_refusal; a thread that exited is no refusal). Under a
/// seccomp filter the call is made only when `forced` (the service asked for perf events alone).
int stallmon_perf_event_open(stallmon_perf_event *event, pid_t tid, uint64_t period_ns, int forced);
void stallmon_perf_event_close(stallmon_perf_event *event);
/// The largest record an event writes: its header, ids, time, registers and stack window.
enum { STALLMON_PERF_RECORD_CAPACITY = 32 * 1024 + 1024 };

/// The newest record of the event's ring, copied into `record` (`capacity` bytes, the caller's:
/// one a watchdog) and unwound into `out`, waiting up to `timeout_ns` for one: 0, or -1 with
/// `out->status` STALLMON_SAMPLE_TIMEOUT (the thread did not run on a CPU).
int stallmon_perf_event_sample(stallmon_perf_event *event, unsigned char *record, size_t capacity, int max_frames,
                               uint64_t timeout_ns, stallmon_sample *out);

#endif
#endif
