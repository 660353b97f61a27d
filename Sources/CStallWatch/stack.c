#include "stallwatch.h"

#if defined(STALLMON_LINUX)

#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

// Stacks of another process's threads, unwound through elfutils' libdwfl over the unwind tables
// (.eh_frame) of the images /proc/PID/maps lists. Nothing stops the process or signals it: no
// ptrace.
//
// - A thread blocked in a system call, in place: the stack pointer and program counter from
//   /proc/PID/task/TID/syscall, the stack and every other word from /proc/PID/mem. The thread stays
//   blocked while it is read (its stack does not change); if it returns meanwhile, what is read is
//   a stack that was, and the caller checks the system call is still the one it saw.
// - A thread on a CPU, from a perf event on it (task clock, user space, PERF_SAMPLE_REGS_USER |
//   PERF_SAMPLE_STACK_USER): the kernel copies every register and the top of the stack when the
//   thread has run a millisecond; the stack is read from the copy (never from the live stack, which
//   has moved on), other words from /proc/PID/mem.

/// DWARF's number of the stack pointer register.
#if defined(__x86_64__)
enum { STALLWATCH_DWARF_SP = 7 };
#elif defined(__aarch64__)
enum { STALLWATCH_DWARF_SP = 31 };
#endif

/// DWARF's x86-64 registers rax … r15 (0-15); the program counter apart.
enum { STALLWATCH_DWARF_REGISTERS = 16 };

typedef struct {
    pid_t tid;
    int memory;
    /// The registers known: the stack pointer alone (a blocked thread), or all of them (a sample).
    uint64_t registers[STALLWATCH_DWARF_REGISTERS];
    int all_registers;
    uint64_t sp, pc;
    /// The stack window the kernel copied, [sp, sp + copy_size); none for a blocked thread.
    const unsigned char *copy;
    uint64_t copy_size;
    uint64_t *frames;
    int count, capacity;
} stallwatch_unwind_context;

/// How far above the copied window a read still counts as the stack (and fails rather than read
/// the live stack, which has moved on): a thread's stack is at most this far from its sp here.
static const uint64_t stallwatch_stack_reach = 8u << 20;

/// A process whose images libdwfl has read, kept between looks: reading the images' unwind tables
/// again for each look cost 30-40 ms for a Swift service's 120 MB debug build. Its `dwfl` is
/// attached to the process once (the callbacks' argument is this entry, whose `current` is the
/// look in progress) and reported again when /proc/PID/maps changes (a library loaded or unloaded,
/// or the PID taken by another process). Used by the one thread that takes stacks.
typedef struct {
    pid_t pid;
    Dwfl *dwfl;
    uint64_t maps_hash;
    uint64_t last_use;
    stallwatch_unwind_context *current;
} stallwatch_process;

enum { STALLWATCH_PROCESSES = 8 };
static stallwatch_process stallwatch_processes[STALLWATCH_PROCESSES];
static uint64_t stallwatch_uses;

static pid_t stallwatch_next_thread(Dwfl *dwfl, void *argument, void **thread_argument) {
    (void)dwfl;
    stallwatch_unwind_context *context = ((stallwatch_process *)argument)->current;
    if (*thread_argument != NULL) return 0;
    *thread_argument = context;
    return context->tid;
}

static bool stallwatch_get_thread(Dwfl *dwfl, pid_t tid, void *argument, void **thread_argument) {
    (void)dwfl;
    stallwatch_unwind_context *context = ((stallwatch_process *)argument)->current;
    if (tid != context->tid) return false;
    *thread_argument = context;
    return true;
}

static bool stallwatch_memory_read(Dwfl *dwfl, Dwarf_Addr address, Dwarf_Word *result, void *argument) {
    (void)dwfl;
    stallwatch_unwind_context *context = ((stallwatch_process *)argument)->current;
    if (context->copy != NULL && address >= context->sp && address - context->sp < stallwatch_stack_reach) {
        if (address - context->sp + sizeof *result > context->copy_size) return false;
        memcpy(result, context->copy + (address - context->sp), sizeof *result);
        return true;
    }
    return pread(context->memory, result, sizeof *result, (off_t)address) == (ssize_t)sizeof *result;
}

static bool stallwatch_set_initial_registers(Dwfl_Thread *thread, void *argument) {
    stallwatch_unwind_context *context = argument;
#if defined(__x86_64__) || defined(__aarch64__)
    if (context->all_registers) {
        Dwarf_Word registers[STALLWATCH_DWARF_REGISTERS];
        for (int i = 0; i < STALLWATCH_DWARF_REGISTERS; i++) registers[i] = context->registers[i];
        if (!dwfl_thread_state_registers(thread, 0, STALLWATCH_DWARF_REGISTERS, registers)) return false;
        dwfl_thread_state_register_pc(thread, context->pc);
        return true;
    }
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

/// FNV-1a of the executable mappings of /proc/PID/maps: what changes when the process's images do
/// (a library loaded or unloaded, or the PID taken by another process), and not when its heap or
/// its threads' stacks come and go, which a busy service's do all the time. 0 when unreadable.
static uint64_t stallwatch_maps_hash(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
    FILE *maps = fopen(path, "re");
    if (maps == NULL) return 0;
    uint64_t hash = 14695981039346656037u;
    char line[4096 + 256];
    while (fgets(line, sizeof line, maps) != NULL) {
        // "start-end perms offset dev inode path": executable and backed by a file.
        const char *perms = strchr(line, ' ');
        if (perms == NULL || strlen(perms) < 4 || perms[3] != 'x' || strchr(line, '/') == NULL) continue;
        for (const char *c = line; *c; c++) hash = (hash ^ (unsigned char)*c) * 1099511628211u;
    }
    fclose(maps);
    return hash;
}

static void stallwatch_release(stallwatch_process *process) {
    if (process->dwfl) dwfl_end(process->dwfl);
    memset(process, 0, sizeof *process);
}

void stallwatch_forget_process(pid_t pid) {
    for (int i = 0; i < STALLWATCH_PROCESSES; i++) {
        if (stallwatch_processes[i].pid == pid) stallwatch_release(&stallwatch_processes[i]);
    }
}

/// Process `pid`'s entry with its images reported and attached: kept from an earlier look while
/// its maps are the same, else made again (taking the least recently used entry when all are).
/// NULL when libdwfl cannot read the process.
static stallwatch_process *stallwatch_process_for(pid_t pid) {
    uint64_t hash = stallwatch_maps_hash(pid);
    if (hash == 0) return NULL;
    stallwatch_process *process = NULL;
    for (int i = 0; i < STALLWATCH_PROCESSES; i++) {
        stallwatch_process *candidate = &stallwatch_processes[i];
        if (candidate->pid == pid) {
            process = candidate;
            break;
        }
        if (process == NULL || candidate->last_use < process->last_use) process = candidate;
    }
    process->last_use = ++stallwatch_uses;
    if (process->pid == pid && process->maps_hash == hash && process->dwfl) return process;
    stallwatch_release(process);
    process->last_use = stallwatch_uses;
    Dwfl *dwfl = dwfl_begin(&stallwatch_dwfl_callbacks);
    if (dwfl == NULL) return NULL;
    dwfl_report_begin(dwfl);
    int reported = dwfl_linux_proc_report(dwfl, pid);
    if (dwfl_report_end(dwfl, NULL, NULL) != 0 || reported != 0
        || !dwfl_attach_state(dwfl, NULL, pid, &stallwatch_thread_callbacks, process)) {
        dwfl_end(dwfl);
        return NULL;
    }
    process->pid = pid;
    process->dwfl = dwfl;
    process->maps_hash = hash;
    return process;
}

/// Unwinds `context`'s thread of process `pid`: the count of frames, or -1.
static int stallwatch_unwind(pid_t pid, stallwatch_unwind_context *context) {
    if (context->capacity <= 0) return 0;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/mem", (int)pid);
    context->memory = open(path, O_RDONLY | O_CLOEXEC);
    if (context->memory < 0) return -1;
    int count = -1;
    stallwatch_process *process = stallwatch_process_for(pid);
    if (process != NULL) {
        process->current = context;
        // Ends with an error where the tables end or a register the unwinding needs is unknown
        // (a blocked thread's without the kernel's registers: only sp and pc are known): the frames
        // up to there are the stack.
        dwfl_getthread_frames(process->dwfl, context->tid, stallwatch_frame, context);
        process->current = NULL;
        count = context->count;
    }
    close(context->memory);
    return count;
}

int stallwatch_unwind_blocked(pid_t pid, pid_t tid, uint64_t sp, uint64_t pc, uint64_t *frames, int capacity) {
    stallwatch_unwind_context context = {.tid = tid, .sp = sp, .pc = pc, .frames = frames, .capacity = capacity};
    return stallwatch_unwind(pid, &context);
}

int stallwatch_unwind_blocked_registers(pid_t pid, pid_t tid, const struct stallwatch_user_registers *registers,
                                        uint64_t *frames, int capacity) {
#if defined(__x86_64__)
    stallwatch_unwind_context context = {.tid = tid, .all_registers = 1, .pc = registers->pc,
                                         .frames = frames, .capacity = capacity};
    for (int i = 0; i < STALLWATCH_DWARF_REGISTERS; i++) context.registers[i] = registers->dwarf[i];
    context.sp = context.registers[STALLWATCH_DWARF_SP];
    return stallwatch_unwind(pid, &context);
#else
    // The registers are x86-64's, in its DWARF numbering.
    (void)pid, (void)tid, (void)registers, (void)frames, (void)capacity;
    return -1;
#endif
}

#if defined(__x86_64__)

// MARK: - A running thread, from a perf event

/// The user registers a sample carries (perf's x86 numbering: ax bx cx dx si di bp sp ip, then
/// r8-r15 at 16-23), in that order, and where each goes among DWARF's.
static const uint64_t stallwatch_sample_registers = 0x1ffu | (0xffu << 16);
static const int stallwatch_dwarf_of_sample[17] = {0, 3, 2, 1, 4, 5, 6, 7, -1, 8, 9, 10, 11, 12, 13, 14, 15};
enum { STALLWATCH_SAMPLE_IP = 8, STALLWATCH_SAMPLE_REGISTER_COUNT = 17 };
/// The stack window a sample copies, and the ring's data pages (a power of two, room for two).
enum { STALLWATCH_STACK_WINDOW = 16384, STALLWATCH_RING_PAGES = 16 };

/// Copies `length` bytes at `offset` of the ring's data area (`size` bytes), which may wrap.
static void stallwatch_ring_copy(const unsigned char *data, uint64_t size, uint64_t offset, void *out, size_t length) {
    uint64_t start = offset & (size - 1);
    size_t first = length < size - start ? length : (size_t)(size - start);
    memcpy(out, data + start, first);
    memcpy((unsigned char *)out + first, data, length - first);
}

int stallwatch_sample_running(pid_t pid, pid_t tid, int timeout_ms, uint64_t *frames, int capacity) {
    struct perf_event_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    attr.type = PERF_TYPE_SOFTWARE;
    attr.config = PERF_COUNT_SW_TASK_CLOCK;
    attr.sample_period = 1000000;  // a millisecond of the thread's CPU time
    attr.sample_type = PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER;
    attr.sample_regs_user = stallwatch_sample_registers;
    attr.sample_stack_user = STALLWATCH_STACK_WINDOW;
    attr.exclude_kernel = 1;
    attr.exclude_hv = 1;
    attr.wakeup_events = 1;
    int descriptor = (int)syscall(SYS_perf_event_open, &attr, tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (descriptor < 0) return -1;
    long page = sysconf(_SC_PAGESIZE);
    size_t length = (size_t)page * (1 + STALLWATCH_RING_PAGES);
    void *ring = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, descriptor, 0);
    int count = -1;
    struct pollfd ready = {.fd = descriptor, .events = POLLIN};
    if (ring != MAP_FAILED && poll(&ready, 1, timeout_ms) == 1) {
        struct perf_event_mmap_page *header = ring;
        const unsigned char *data = (const unsigned char *)ring + page;
        uint64_t size = (uint64_t)page * STALLWATCH_RING_PAGES;
        uint64_t head = __atomic_load_n(&header->data_head, __ATOMIC_ACQUIRE);
        static unsigned char record[STALLWATCH_STACK_WINDOW + 1024];
        uint64_t offset = header->data_tail, sample = UINT64_MAX;
        size_t sample_size = 0;
        // The first sample is enough: the thread is stalled, and each is a look at the same stall.
        while (offset < head) {
            struct perf_event_header event;
            stallwatch_ring_copy(data, size, offset, &event, sizeof event);
            if (event.size == 0) break;
            if (event.type == PERF_RECORD_SAMPLE && event.size <= sizeof record) {
                sample = offset;
                sample_size = event.size;
                break;
            }
            offset += event.size;
        }
        if (sample != UINT64_MAX) {
            stallwatch_ring_copy(data, size, sample, record, sample_size);
            // header, abi, registers, stack size, stack, dynamic size
            const unsigned char *cursor = record + sizeof(struct perf_event_header);
            uint64_t abi, window;
            memcpy(&abi, cursor, 8);
            cursor += 8;
            uint64_t values[STALLWATCH_SAMPLE_REGISTER_COUNT];
            memcpy(values, cursor, sizeof values);
            cursor += sizeof values;
            memcpy(&window, cursor, 8);
            cursor += 8;
            uint64_t dynamic = 0;
            if (window > 0 && cursor + window + 8 <= record + sample_size) memcpy(&dynamic, cursor + window, 8);
            if (abi != PERF_SAMPLE_REGS_ABI_NONE && dynamic > 0 && dynamic <= window) {
                stallwatch_unwind_context context = {.tid = tid, .all_registers = 1, .copy = cursor,
                                                     .copy_size = dynamic, .frames = frames, .capacity = capacity};
                for (int i = 0; i < STALLWATCH_SAMPLE_REGISTER_COUNT; i++) {
                    if (stallwatch_dwarf_of_sample[i] >= 0) context.registers[stallwatch_dwarf_of_sample[i]] = values[i];
                }
                context.sp = context.registers[STALLWATCH_DWARF_SP];
                context.pc = values[STALLWATCH_SAMPLE_IP];
                count = stallwatch_unwind(pid, &context);
            }
        }
    }
    if (ring != MAP_FAILED) munmap(ring, length);
    close(descriptor);
    return count;
}

#else

int stallwatch_sample_running(pid_t pid, pid_t tid, int timeout_ms, uint64_t *frames, int capacity) {
    (void)pid, (void)tid, (void)timeout_ms, (void)frames, (void)capacity;
    return -1;
}

#endif

#endif
