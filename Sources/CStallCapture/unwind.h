#ifndef STALLMON_UNWIND_H
#define STALLMON_UNWIND_H

// Inside CStallCapture: this process's memory read safely, its images (modules.c), and unwinding
// away from the unwound thread (remote_unwind.c), shared by the sampling handler and the watchdog
// (sampler.c, blocked.c, perf.c).

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

/// An image loaded in this process: its executable segments and its .eh_frame_hdr (modules.c).
typedef struct {
    uintptr_t start, end;  // executable segments
    uintptr_t header;      // .eh_frame_hdr
    uintptr_t table;       // its binary-search table
    uintptr_t count;       // entries in the table
} stallmon_module;

/// The image whose code holds `ip`, the images listed again from /proc/self/maps when none known
/// does: 0, or -1.
int stallmon_module_find(uintptr_t ip, stallmon_module *out);
/// The module table's lock, for the fork handlers; the child's table starts empty and unlocked.
void stallmon_modules_lock(void);
void stallmon_modules_unlock(void);
void stallmon_modules_reset_in_child(void);
/// After fork(): the child's own /proc/self/mem under the parent's descriptor number.
void stallmon_memory_reopen_in_child(void);

/// Unwinds a stack from the registers and the window of the stack that a handler copied, [sp, sp +
/// `length`); addresses in [sp, `stack_limit`) beyond the copy are not read. Returns 0 with at
/// least one frame, or a negative libunwind code.
int stallmon_unwind_copied(const stallmon_captured_registers *registers, const void *stack, size_t length,
                           uintptr_t stack_limit, int max_frames, uintptr_t *frames, int *frame_count,
                           int *truncated);

#endif
#endif
