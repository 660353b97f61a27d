#ifndef STALLMON_SAMPLER_H
#define STALLMON_SAMPLER_H

// Inside CStallCapture: what the sampler (sampler.c) shares with the installation of its signal
// (sampling_signal.c).

#include "stallcapture.h"

#if defined(STALLMON_LINUX)

#include <signal.h>

#include "unwind.h"

/// The sampling signal's handler (async-signal-safe): copies the interrupted thread's registers and
/// the top of its stack into the slot the request names.
void stallmon_sample_handler(int signo, siginfo_t *info, void *context);

/// Sets the slots up once (their fork handlers); every caller returns after the first is done.
void stallmon_sampler_initialize(void);

/// Whether the register copy shows a system call that the signal ended with EINTR (watchdog side).
int stallmon_interrupted_system_call(const stallmon_captured_registers *registers);

#endif
#endif
