// The kernel takes the stack: a perf event on the stalled thread.
//
// When a stall's thread runs on a CPU, the watchdog opens a task-clock software event on that
// thread alone (perf_event_open with its TID, user space only), sampling its registers and a window
// of its user stack (PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER, as large as the signal path
// copies) into a ring the watchdog maps. The kernel copies the stack at each overflow, from the
// thread's own context, and no signal reaches the program: no handler runs on its thread, no system
// call of its ends with EINTR, no real-time signal is needed. The watchdog unwinds each record with
// the code that unwinds the signal path's copies (remote_unwind.c).
//
// An event is opened when a stall's first sample finds the thread running, and closed when the
// stall ends (stallmon_perf_close_thread): no descriptor is held while no stall lasts. A slot (one
// watchdog) holds at most PERF_EVENTS_PER_SLOT events at once; each is one descriptor and a ring of
// 1 + PERF_DATA_PAGES pages. The first overflow comes after PERF_FIRST_PERIOD_NS of the thread's
// CPU time, so that the stall's first sample has a stack at once; then the period is half the
// sample interval.
//
// Where the kernel refuses (perf_event_paranoid 3, the default of Debian's and Ubuntu's kernels
// for unprivileged users; a ring that cannot be mapped), the process falls back to the signal path
// for good, and the refusal is kept for the monitor to say once. Under a seccomp filter
// (/proc/self/status "Seccomp: 2": Docker's default profile, a unit's SystemCallFilter=) the call
// is not even tried unless the service asked for perf events alone: a filter may kill the process
// for a call it does not list (SystemCallFilter='s default action is SIGSYS), and nothing tells
// beforehand what a filter would do.

#define _GNU_SOURCE
#include "stallcapture.h"
#include "perf.h"
#include "stallcapture_threadview.h"
#include "unwind.h"

#if defined(STALLMON_LINUX)

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>

#if defined(__x86_64__)
#include <asm/perf_regs.h>
#endif

enum {
    PERF_STACK_WINDOW = 32 * 1024,  // as the signal path's copy
    PERF_DATA_PAGES = 16,           // 64 KiB: the newest record and the start of the next
    PERF_FIRST_PERIOD_NS = 100 * 1000,
    PERF_LATER_WAIT_NS = 2 * 1000 * 1000,
};

static _Atomic int refused_errno;  // 0 while the kernel has not refused
static _Atomic int refused_step;   // stallmon_perf_step

int stallmon_perf_refusal(int *step) {
    int error = atomic_load_explicit(&refused_errno, memory_order_acquire);
    if (step != NULL) *step = atomic_load_explicit(&refused_step, memory_order_relaxed);
    return error;
}

void stallmon_perf_refuse_for_tests(int error) {
    atomic_store_explicit(&refused_step, STALLMON_PERF_STEP_OPEN, memory_order_relaxed);
    atomic_store_explicit(&refused_errno, error, memory_order_release);
}

static void refuse(int step, int error) {
    int expected = 0;
    if (error == 0) error = EINVAL;
    atomic_store_explicit(&refused_step, step, memory_order_relaxed);
    atomic_compare_exchange_strong_explicit(&refused_errno, &expected, error, memory_order_release,
                                            memory_order_relaxed);
}

#if defined(__x86_64__)

// The registers the kernel samples, in the order of their bits (the record's order).
static const int sampled_registers[STALLMON_CAPTURED_REGISTER_COUNT] = {
    PERF_REG_X86_AX, PERF_REG_X86_BX, PERF_REG_X86_CX, PERF_REG_X86_DX,  PERF_REG_X86_SI,  PERF_REG_X86_DI,
    PERF_REG_X86_BP, PERF_REG_X86_SP, PERF_REG_X86_IP, PERF_REG_X86_R8,  PERF_REG_X86_R9,  PERF_REG_X86_R10,
    PERF_REG_X86_R11, PERF_REG_X86_R12, PERF_REG_X86_R13, PERF_REG_X86_R14, PERF_REG_X86_R15,
};
// Where each of them goes in stallmon_captured_registers (DWARF's order: rax rdx rcx rbx rsi rdi
// rbp rsp r8 … r15 rip).
static const int captured_index[STALLMON_CAPTURED_REGISTER_COUNT] = {
    0, 3, 2, 1, 4, 5, 6, 7, 16, 8, 9, 10, 11, 12, 13, 14, 15,
};

static uint64_t register_mask(void) {
    uint64_t mask = 0;
    for (int i = 0; i < STALLMON_CAPTURED_REGISTER_COUNT; i++) mask |= 1ULL << sampled_registers[i];
    return mask;
}

void stallmon_perf_event_init(stallmon_perf_event *event) {
    memset(event, 0, sizeof *event);
    event->descriptor = -1;
}

/// Whether a seccomp filter applies to this thread (the "Seccomp:" line of /proc/thread-self/status
/// is 2), or -1 when that cannot be read.
static int filtered_by_seccomp(void) {
    uint64_t mode;
    int found = stallmon_read_status_field(STALLMON_THREAD_SELF, "Seccomp", 10, &mode);
    if (found < 0) return -1;
    return found == 1 && mode == 2;  // no such line: a kernel without seccomp
}

static long page_size(void) { return sysconf(_SC_PAGESIZE); }

void stallmon_perf_event_close(stallmon_perf_event *event) {
    if (event->ring != NULL) munmap(event->ring, (size_t)(1 + PERF_DATA_PAGES) * (size_t)page_size());
    if (event->descriptor >= 0) close(event->descriptor);
    stallmon_perf_event_init(event);
}

int stallmon_perf_event_open(stallmon_perf_event *event, pid_t tid, uint64_t period_ns, int forced) {
    stallmon_perf_event_init(event);
    if (atomic_load_explicit(&refused_errno, memory_order_acquire) != 0) return -1;
    if (!forced && filtered_by_seccomp() != 0) {
        refuse(STALLMON_PERF_STEP_SECCOMP, EPERM);
        return -1;
    }
    struct perf_event_attr attributes;
    memset(&attributes, 0, sizeof attributes);
    attributes.size = sizeof attributes;
    attributes.type = PERF_TYPE_SOFTWARE;
    attributes.config = PERF_COUNT_SW_TASK_CLOCK;
    attributes.sample_period = PERF_FIRST_PERIOD_NS;
    attributes.sample_type = PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER;
    attributes.sample_regs_user = register_mask();
    attributes.sample_stack_user = PERF_STACK_WINDOW;
    attributes.exclude_kernel = 1;
    attributes.exclude_hv = 1;
    attributes.exclude_callchain_kernel = 1;
    attributes.use_clockid = 1;
    attributes.clockid = CLOCK_MONOTONIC;
    attributes.wakeup_events = 1;
    int descriptor = (int)syscall(SYS_perf_event_open, &attributes, tid, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (descriptor < 0) {
        int error = errno;
        // The thread exited: no refusal of the kernel's.
        if (error == ESRCH) return -1;
        refuse(STALLMON_PERF_STEP_OPEN, error);
        return -1;
    }
    size_t length = (size_t)(1 + PERF_DATA_PAGES) * (size_t)page_size();
    void *ring = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_SHARED, descriptor, 0);
    if (ring == MAP_FAILED) {
        int error = errno;
        close(descriptor);
        refuse(STALLMON_PERF_STEP_MAP, error);
        return -1;
    }
    event->descriptor = descriptor;
    event->ring = ring;
    event->tid = tid;
    // Half a sample interval of CPU time (1 ms at least): a thread that shares its CPU still leaves
    // a record between two samples, and the watchdog seldom has to wait for one.
    event->period_ns = period_ns / 2 > 1000000 ? period_ns / 2 : 1000000;
    event->first_period = 1;
    return 0;
}

/// The newest sample record in the ring, copied into `record` (records may wrap around the end of
/// the ring); every record up to the head is consumed. Returns its size, 0 when there is none.
static size_t newest_record(stallmon_perf_event *event, unsigned char *record, size_t capacity) {
    struct perf_event_mmap_page *meta = event->ring;
    uint64_t head = __atomic_load_n(&meta->data_head, __ATOMIC_ACQUIRE);
    uint64_t tail = meta->data_tail;
    const unsigned char *data = (const unsigned char *)event->ring + page_size();
    uint64_t size = (uint64_t)PERF_DATA_PAGES * (uint64_t)page_size();
    // Find the newest sample by the headers alone, then copy that one record.
    uint64_t newest = 0;
    size_t found = 0;
    while (tail < head) {
        struct perf_event_header header;
        for (size_t i = 0; i < sizeof header; i++) ((unsigned char *)&header)[i] = data[(tail + i) % size];
        if (header.size < sizeof header || tail + header.size > head) break;
        if (header.type == PERF_RECORD_SAMPLE && header.size <= capacity) {
            newest = tail;
            found = header.size;
        }
        tail += header.size;
    }
    if (found > 0) {
        uint64_t start = newest % size;
        uint64_t first = size - start < found ? size - start : found;
        memcpy(record, data + start, first);
        memcpy(record + first, data, found - first);
    }
    __atomic_store_n(&meta->data_tail, head, __ATOMIC_RELEASE);
    return found;
}

/// Fills `out` from a PERF_RECORD_SAMPLE of this event's sample type: the pid and tid, the time,
/// the registers and the stack.
static int unwind_record(const unsigned char *record, size_t length, int max_frames, stallmon_sample *out) {
    const unsigned char *cursor = record + sizeof(struct perf_event_header);
    const unsigned char *end = record + length;
#define TAKE(value)                                                                                                    \
    do {                                                                                                               \
        if (cursor + sizeof(value) > end) return -1;                                                                   \
        memcpy(&(value), cursor, sizeof(value));                                                                       \
        cursor += sizeof(value);                                                                                       \
    } while (0)
    uint32_t pid, tid;
    uint64_t time, abi, stack_size, dynamic_size = 0;
    TAKE(pid);
    TAKE(tid);
    TAKE(time);
    TAKE(abi);
    if (abi == PERF_SAMPLE_REGS_ABI_NONE) return -1;  // the thread was in the kernel with no user context
    stallmon_captured_registers registers;
    for (int i = 0; i < STALLMON_CAPTURED_REGISTER_COUNT; i++) {
        uint64_t value;
        TAKE(value);
        registers.values[captured_index[i]] = (uintptr_t)value;
    }
    TAKE(stack_size);
    const unsigned char *stack = cursor;
    if (cursor + stack_size > end) return -1;
    cursor += stack_size;
    if (stack_size != 0) TAKE(dynamic_size);
#undef TAKE
    if (dynamic_size > stack_size) dynamic_size = stack_size;
    (void)pid;
    out->sampled_tid = (pid_t)tid;
    out->handler_enter_ns = time;
    out->handler_exit_ns = time;
    out->stack_bytes = (int)dynamic_size;
    uintptr_t sp = registers.values[STALLMON_CAPTURED_SP];
    int count = 0, truncated = 0;
    int rc = stallmon_unwind_copied(&registers, stack, (size_t)dynamic_size, sp + PERF_STACK_WINDOW, max_frames,
                                    out->frames, &count, &truncated);
    if (rc != 0) {
        out->status = STALLMON_SAMPLE_UNWIND_FAILED;
        out->error = rc;
        return 0;
    }
    out->status = STALLMON_SAMPLE_OK;
    out->frame_count = count;
    out->truncated = truncated;
    return 0;
}

int stallmon_perf_event_sample(stallmon_perf_event *event, unsigned char *record, size_t capacity, int max_frames,
                               uint64_t timeout_ns, stallmon_sample *out) {
    out->source = STALLMON_STACK_PERF;
    // The stall's first record comes after 100 µs of the thread's CPU time: for it the watchdog
    // waits the whole timeout. Later, a thread that left no record since the last sample has hardly
    // run: the watchdog waits a little (it also has the stall's end to notice), and the sample goes
    // unanswered.
    if (!event->first_period && timeout_ns > PERF_LATER_WAIT_NS) timeout_ns = PERF_LATER_WAIT_NS;
    uint64_t deadline = stallmon_now_ns() + timeout_ns;
    out->requested_ns = stallmon_now_ns();
    for (;;) {
        size_t length = newest_record(event, record, capacity);
        if (length > 0) {
            if (event->first_period) {
                // The stall's first stack is in: from now on one a sample interval.
                event->first_period = 0;
                uint64_t period = event->period_ns;
                ioctl(event->descriptor, PERF_EVENT_IOC_PERIOD, &period);
            }
            if (unwind_record(record, length, max_frames, out) == 0) return 0;
        }
        uint64_t now = stallmon_now_ns();
        if (now >= deadline) break;
        struct pollfd poll_descriptor = {.fd = event->descriptor, .events = POLLIN};
        uint64_t left_ms = (deadline - now + 999999) / 1000000;
        int rc = poll(&poll_descriptor, 1, (int)left_ms);
        if (rc < 0 && errno != EINTR) break;
        if (rc > 0 && (poll_descriptor.revents & (POLLHUP | POLLERR))) break;  // the thread exited
    }
    out->status = STALLMON_SAMPLE_TIMEOUT;
    out->error = ETIME;
    return -1;
}

#else

void stallmon_perf_event_init(stallmon_perf_event *event) {
    memset(event, 0, sizeof *event);
    event->descriptor = -1;
}
void stallmon_perf_event_close(stallmon_perf_event *event) { stallmon_perf_event_init(event); }
int stallmon_perf_event_open(stallmon_perf_event *event, pid_t tid, uint64_t period_ns, int forced) {
    (void)forced;
    (void)tid;
    (void)period_ns;
    stallmon_perf_event_init(event);
    refuse(STALLMON_PERF_STEP_OPEN, EOPNOTSUPP);  // only x86-64's registers are mapped so far
    return -1;
}
int stallmon_perf_event_sample(stallmon_perf_event *event, unsigned char *record, size_t capacity, int max_frames,
                               uint64_t timeout_ns, stallmon_sample *out) {
    (void)event;
    (void)record;
    (void)capacity;
    (void)max_frames;
    (void)timeout_ns;
    out->status = STALLMON_SAMPLE_TIMEOUT;
    return -1;
}

#endif

#endif  // STALLMON_LINUX
