#ifndef STALLMON_UNWIND_H
#define STALLMON_UNWIND_H

// Inside CStallCapture: this process's memory read safely, and unwinding away from the unwound
// thread (remote_unwind.c), shared by the sampling handler and the watchdog (sampler.c).

#include "stallcapture.h"

#if defined(STALLMON_LINUX)

#include <stddef.h>
#include <sys/types.h>

/// The registers a sampling handler copies, in DWARF's x86-64 order: rax rdx rcx rbx rsi rdi rbp
/// rsp r8 … r15, then rip.
enum { STALLMON_CAPTURED_REGISTER_COUNT = 17, STALLMON_CAPTURED_SP = 7, STALLMON_CAPTURED_PC = 16 };
typedef struct {
    uintptr_t values[STALLMON_CAPTURED_REGISTER_COUNT];
} stallmon_captured_registers;

/// Opens /proc/self/mem once (again when the program closed or reused its descriptor); the
/// descriptor, or -1. Watchdog side only.
int stallmon_memory_open(void);
/// The descriptor opened, or -1 (async-signal-safe).
int stallmon_memory_descriptor(void);
/// Reads up to `length` bytes at `address` of this process: the count read, short where the
/// memory ends, or -1. Never faults; async-signal-safe (pread).
ssize_t stallmon_memory_read(void *buffer, size_t length, uintptr_t address);
/// Registers the fork handlers of the unwinder's locks and descriptor (once).
void stallmon_unwind_register_fork_handlers(void);

/// Unwinds a stack from the registers and the window of the stack that a handler copied, [sp, sp +
/// `length`); addresses in [sp, `stack_limit`) beyond the copy are not read. Returns 0 with at
/// least one frame, or a negative libunwind code.
int stallmon_unwind_copied(const stallmon_captured_registers *registers, const void *stack, size_t length,
                           uintptr_t stack_limit, int max_frames, uintptr_t *frames, int *frame_count,
                           int *truncated);

#endif
#endif
