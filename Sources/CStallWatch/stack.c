#include "stallwatch.h"

#if defined(STALLWATCH_LINUX)

#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <unistd.h>

// The stack of a thread of another process that is blocked in a system call, unwound in place:
// the stack pointer and program counter from /proc/PID/task/TID/syscall, the stack and every
// other word from /proc/PID/mem, the unwind tables (.eh_frame) of the images /proc/PID/maps lists,
// through elfutils' libdwfl. Nothing stops the process or signals it: no ptrace. The thread stays
// blocked while it is read (its stack does not change); if it returns meanwhile, what is read is a
// stack that was, and the caller checks the system call is still the one it saw.

/// DWARF's number of the stack pointer register.
#if defined(__x86_64__)
enum { STALLWATCH_DWARF_SP = 7 };
#elif defined(__aarch64__)
enum { STALLWATCH_DWARF_SP = 31 };
#endif

typedef struct {
    pid_t tid;
    int memory;
    uint64_t sp, pc;
    uint64_t *frames;
    int count, capacity;
} stallwatch_unwind_context;

static pid_t stallwatch_next_thread(Dwfl *dwfl, void *argument, void **thread_argument) {
    (void)dwfl;
    stallwatch_unwind_context *context = argument;
    if (*thread_argument != NULL) return 0;
    *thread_argument = context;
    return context->tid;
}

static bool stallwatch_get_thread(Dwfl *dwfl, pid_t tid, void *argument, void **thread_argument) {
    (void)dwfl;
    stallwatch_unwind_context *context = argument;
    if (tid != context->tid) return false;
    *thread_argument = context;
    return true;
}

static bool stallwatch_memory_read(Dwfl *dwfl, Dwarf_Addr address, Dwarf_Word *result, void *argument) {
    (void)dwfl;
    stallwatch_unwind_context *context = argument;
    return pread(context->memory, result, sizeof *result, (off_t)address) == (ssize_t)sizeof *result;
}

static bool stallwatch_set_initial_registers(Dwfl_Thread *thread, void *argument) {
    stallwatch_unwind_context *context = argument;
#if defined(__x86_64__) || defined(__aarch64__)
    Dwarf_Word sp = context->sp;
    if (!dwfl_thread_state_registers(thread, STALLWATCH_DWARF_SP, 1, &sp)) return false;
    dwfl_thread_state_register_pc(thread, context->pc);
    return true;
#else
    (void)thread;
    (void)context;
    return false;
#endif
}

static const Dwfl_Thread_Callbacks stallwatch_thread_callbacks = {
    .next_thread = stallwatch_next_thread,
    .get_thread = stallwatch_get_thread,
    .memory_read = stallwatch_memory_read,
    .set_initial_registers = stallwatch_set_initial_registers,
};

static int stallwatch_frame(Dwfl_Frame *frame, void *argument) {
    stallwatch_unwind_context *context = argument;
    Dwarf_Addr pc;
    bool activation;
    if (!dwfl_frame_pc(frame, &pc, &activation) || pc == 0) return DWARF_CB_ABORT;
    context->frames[context->count++] = pc;
    return context->count < context->capacity ? DWARF_CB_OK : DWARF_CB_ABORT;
}

static char *stallwatch_debuginfo_path = NULL;

static const Dwfl_Callbacks stallwatch_dwfl_callbacks = {
    .find_elf = dwfl_linux_proc_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .debuginfo_path = &stallwatch_debuginfo_path,
};

int stallwatch_unwind_blocked(pid_t pid, pid_t tid, uint64_t sp, uint64_t pc, uint64_t *frames, int capacity) {
    if (capacity <= 0) return 0;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/mem", (int)pid);
    stallwatch_unwind_context context = {
        .tid = tid, .memory = open(path, O_RDONLY | O_CLOEXEC), .sp = sp, .pc = pc, .frames = frames,
        .capacity = capacity};
    if (context.memory < 0) return -1;
    int count = -1;
    Dwfl *dwfl = dwfl_begin(&stallwatch_dwfl_callbacks);
    if (dwfl != NULL) {
        dwfl_report_begin(dwfl);
        int reported = dwfl_linux_proc_report(dwfl, pid);
        if (dwfl_report_end(dwfl, NULL, NULL) == 0 && reported == 0
            && dwfl_attach_state(dwfl, NULL, pid, &stallwatch_thread_callbacks, &context)) {
            // Ends with an error where the tables end or a register the unwinding needs is unknown
            // (only sp and pc are): the frames up to there are the stack.
            dwfl_getthread_frames(dwfl, tid, stallwatch_frame, &context);
            count = context.count;
        }
        dwfl_end(dwfl);
    }
    close(context.memory);
    return count;
}

#endif
