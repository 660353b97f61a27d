// Unwinding a thread of this process away from it: from a copy of its registers and of the top of
// its stack (taken by the sampling signal's handler, sampler.c), or in place while it blocks in a
// system call (from the sp and pc /proc/self/task/<tid>/syscall shows).
//
// Everything here runs on the watchdog thread, never on the thread it unwinds and never in a
// signal handler: it may lock and allocate. libunwind's remote interface does the unwinding, with
// accessors that
//   - read memory through /proc/self/mem (an unmapped address is an error, never a fault), or from
//     the copy where the address lies in the copied window;
//   - find unwind tables (DWARF CFI, .eh_frame_hdr) in a module table built from /proc/self/maps
//     and the ELF headers it maps, read through the same file (modules.c). Nothing here calls
//     dl_iterate_phdr or takes the dynamic loader's lock: a thread interrupted inside that lock
//     (dlopen, dlclose, a C++ throw on an older glibc) can never hold the unwind up.
//
// A copy comes with every register, so CFI restores the caller's registers frame by frame. A
// blocked thread shows only sp and pc: glibc's syscall wrappers keep their CFA sp-relative, so the
// first frames unwind; the callee-saved registers are unknown and reported as unavailable. Swift
// functions (and other code built with frame pointers) take their CFA from rbp, which a blocked
// thread keeps in a register the kernel does not show. When a step fails for want of it, the frame
// pointer of that frame is recovered from its function's prologue (push rbp; mov rbp, rsp; pushes;
// sub rsp, N gives rbp = sp + 8·pushes + N) or, failing that, by scanning the frame for a
// saved-rbp/return-address pair; either is accepted only when the return address follows a call
// instruction inside code that the unwind tables cover. From there CFI restores rbp frame by
// frame, and the unwind goes on.

#define _GNU_SOURCE
#include "stallcapture.h"
#include "unwind.h"

#if defined(STALLMON_LINUX)

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <libunwind.h>

// MARK: - /proc/self/mem

// One descriptor for the process, opened by the watchdog before any sample and read by the
// sampling handler too (pread is async-signal-safe; the kernel copies only mapped memory). A
// child of fork() reopens it: the parent's descriptor reads the parent's memory.
static _Atomic int memory_descriptor = -1;
static dev_t memory_device;
static ino_t memory_inode;
static pthread_mutex_t memory_lock = PTHREAD_MUTEX_INITIALIZER;

static void note_memory_file(int descriptor) {
    struct stat status;
    if (fstat(descriptor, &status) == 0) {
        memory_device = status.st_dev;
        memory_inode = status.st_ino;
    }
}

int stallmon_memory_descriptor(void) { return atomic_load_explicit(&memory_descriptor, memory_order_acquire); }

/// Opens this process's /proc/self/mem and puts it under the number `descriptor` where there is
/// one (readers keep the number), else under a number of its own: the descriptor, or -1 when it
/// cannot be opened (nothing changes then).
static int install_memory_file(int descriptor) {
    int opened = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
    if (opened < 0) return -1;
    note_memory_file(opened);
    if (descriptor >= 0 && dup3(opened, descriptor, O_CLOEXEC) == descriptor) {
        close(opened);
        return descriptor;
    }
    atomic_store_explicit(&memory_descriptor, opened, memory_order_release);
    return opened;
}

int stallmon_memory_open(void) {
    pthread_mutex_lock(&memory_lock);
    int descriptor = atomic_load_explicit(&memory_descriptor, memory_order_acquire);
    struct stat status;
    // A program that closed every descriptor (a daemon's closefrom) may have reused the number.
    int current = descriptor >= 0 && fstat(descriptor, &status) == 0 && status.st_dev == memory_device &&
                  status.st_ino == memory_inode;
    if (!current) descriptor = install_memory_file(descriptor);
    pthread_mutex_unlock(&memory_lock);
    return descriptor;
}

void stallmon_memory_reopen_in_child(void) {
    // After fork(): one thread, no lock of the parent's threads is held by anyone who will release
    // it. The child's own /proc/self/mem replaces the parent's under the same number.
    pthread_mutex_init(&memory_lock, NULL);
    int descriptor = atomic_load_explicit(&memory_descriptor, memory_order_relaxed);
    if (descriptor < 0) return;
    if (install_memory_file(descriptor) < 0) {
        atomic_store_explicit(&memory_descriptor, -1, memory_order_release);
        close(descriptor);
    }
}

ssize_t stallmon_memory_read(void *buffer, size_t length, uintptr_t address) {
    int descriptor = atomic_load_explicit(&memory_descriptor, memory_order_acquire);
    if (descriptor < 0) return -1;
    ssize_t count;
    do {
        count = pread(descriptor, buffer, length, (off_t)address);
    } while (count < 0 && errno == EINTR);
    return count;
}

#if defined(__x86_64__)

// Exported by libunwind's generic library (libunwind-ptrace uses it the same way), not declared
// in its headers: searches a binary-search table of an .eh_frame_hdr through the accessors.
extern int UNW_OBJ(dwarf_search_unwind_table)(unw_addr_space_t as, unw_word_t ip, unw_dyn_info_t *di,
                                              unw_proc_info_t *pi, int need_unwind_info, void *arg);

// MARK: - Reading the unwound thread's memory

enum { BLOCK_SIZE = 64, BLOCK_COUNT = 64 };

typedef struct {
    // Registers by libunwind's x86-64 numbers (RAX … R15, RIP); `known` has a bit for each known.
    uintptr_t registers[UNW_X86_64_RIP + 1];
    uint32_t known;
    // The copied window of the stack, [copy_start, copy_start + copy_length), and the addresses
    // [copy_start, copy_limit) that belonged to the thread's stack when it was copied: an address
    // there beyond the copy is not read from the live stack, which has moved on.
    const unsigned char *copy;
    uintptr_t copy_start;
    size_t copy_length;
    uintptr_t copy_limit;
    uintptr_t tags[BLOCK_COUNT];
    unsigned char valid[BLOCK_COUNT];
    unsigned char blocks[BLOCK_COUNT][BLOCK_SIZE];
} unwind_state;

static int read_block(unwind_state *state, uintptr_t block, const unsigned char **out) {
    unsigned index = (unsigned)((block / BLOCK_SIZE) % BLOCK_COUNT);
    if (!(state->valid[index] && state->tags[index] == block)) {
        if (stallmon_memory_read(state->blocks[index], BLOCK_SIZE, block) != BLOCK_SIZE) {
            state->valid[index] = 0;
            return -1;
        }
        state->tags[index] = block;
        state->valid[index] = 1;
    }
    *out = state->blocks[index];
    return 0;
}

/// Copies `length` bytes at `address` of this process; -1 when any of them is not mapped (or lies
/// in the stack beyond the copied window).
static int read_memory(unwind_state *state, uintptr_t address, void *buffer, size_t length) {
    if (state->copy != NULL && address < state->copy_limit && address + length > state->copy_start) {
        if (address < state->copy_start || address + length > state->copy_start + state->copy_length) return -1;
        memcpy(buffer, state->copy + (address - state->copy_start), length);
        return 0;
    }
    unsigned char *to = buffer;
    while (length > 0) {
        uintptr_t block = address & ~(uintptr_t)(BLOCK_SIZE - 1);
        const unsigned char *data;
        if (read_block(state, block, &data) != 0) return -1;
        size_t offset = address - block;
        size_t part = BLOCK_SIZE - offset < length ? BLOCK_SIZE - offset : length;
        memcpy(to, data + offset, part);
        to += part;
        address += part;
        length -= part;
    }
    return 0;
}

// MARK: - Accessors

static int find_proc_info(unw_addr_space_t space, unw_word_t ip, unw_proc_info_t *info, int need_unwind_info,
                          void *arg) {
    stallmon_module module;
    if (stallmon_module_find((uintptr_t)ip, &module) != 0) return -UNW_ENOINFO;
    unw_dyn_info_t table;
    memset(&table, 0, sizeof table);
    table.format = UNW_INFO_FORMAT_REMOTE_TABLE;
    table.start_ip = module.start;
    table.end_ip = module.end;
    table.u.rti.segbase = module.header;
    table.u.rti.table_data = module.table;
    table.u.rti.table_len = module.count * 8 / sizeof(unw_word_t);
    return UNW_OBJ(dwarf_search_unwind_table)(space, ip, &table, info, need_unwind_info, arg);
}

static void put_unwind_info(unw_addr_space_t space, unw_proc_info_t *info, void *arg) {
    (void)space;
    (void)info;
    (void)arg;
}

static int get_dyn_info_list_addr(unw_addr_space_t space, unw_word_t *address, void *arg) {
    (void)space;
    (void)address;
    (void)arg;
    return -UNW_ENOINFO;
}

static int access_mem(unw_addr_space_t space, unw_word_t address, unw_word_t *value, int write, void *arg) {
    (void)space;
    if (write) return -UNW_EINVAL;
    uintptr_t word;
    if (read_memory(arg, (uintptr_t)address, &word, sizeof word) != 0) return -UNW_EINVAL;
    *value = word;
    return 0;
}

static int access_reg(unw_addr_space_t space, unw_regnum_t reg, unw_word_t *value, int write, void *arg) {
    (void)space;
    unwind_state *state = arg;
    if (write) return -UNW_EREADONLYREG;
    if (reg < 0 || reg > UNW_X86_64_RIP || !(state->known & (1u << reg))) return -UNW_EBADREG;
    *value = state->registers[reg];
    return 0;
}
static int access_fpreg(unw_addr_space_t space, unw_regnum_t reg, unw_fpreg_t *value, int write, void *arg) {
    (void)space;
    (void)reg;
    (void)value;
    (void)write;
    (void)arg;
    return -UNW_EBADREG;
}

static int resume(unw_addr_space_t space, unw_cursor_t *cursor, void *arg) {
    (void)space;
    (void)cursor;
    (void)arg;
    return -UNW_EINVAL;
}

static unw_accessors_t accessors = {
    .find_proc_info = find_proc_info,
    .put_unwind_info = put_unwind_info,
    .get_dyn_info_list_addr = get_dyn_info_list_addr,
    .access_mem = access_mem,
    .access_reg = access_reg,
    .access_fpreg = access_fpreg,
    .resume = resume,
    .get_proc_name = NULL,
};

// The watchdogs' address space, with a cache of the unwind information found. A child of fork()
// makes a new one when it first unwinds: the parent's cache may have been locked by a thread that
// does not exist there. (Only watchdogs unwind, and a watchdog's unwinds are serialized by the
// table's lock below.)
static unw_addr_space_t address_space;
static _Atomic int address_space_stale = 1;
static pthread_mutex_t unwind_lock = PTHREAD_MUTEX_INITIALIZER;

static int begin_unwinding(void) {
    pthread_mutex_lock(&unwind_lock);
    if (atomic_exchange(&address_space_stale, 0)) {
        address_space = unw_create_addr_space(&accessors, 0);
        if (address_space) unw_set_caching_policy(address_space, UNW_CACHE_GLOBAL);
    }
    if (address_space == NULL) {
        atomic_store(&address_space_stale, 1);
        pthread_mutex_unlock(&unwind_lock);
        return -1;
    }
    return 0;
}

static void end_unwinding(void) { pthread_mutex_unlock(&unwind_lock); }

static void unwinding_child(void) {
    pthread_mutex_init(&unwind_lock, NULL);
    atomic_store(&address_space_stale, 1);
}

// MARK: - Frame pointer recovery

/// Whether `address` follows a call instruction: a return address, not just any code address.
static int follows_call(unwind_state *state, uintptr_t address) {
    unsigned char code[8];
    if (address < 8 || read_memory(state, address - 8, code, sizeof code) != 0) return 0;
    // call rel32
    if (code[3] == 0xe8) return 1;
    // call r/m64 (ff /2): register (2 or 3 bytes with REX), [reg+disp8] (3-4), [reg+disp32]/[rip+disp32] (6-7)
    static const int lengths[] = {2, 3, 4, 6, 7};
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
        int at = 8 - lengths[i];
        if (code[at] == 0xff && (code[at + 1] & 0x38) == 0x10) return 1;
    }
    return 0;
}

/// Whether `address` returns into a function: it follows a call instruction, and the call lies in
/// code that unwind tables cover. Bytes of data that happen to look like a call (a stale word that
/// points into type metadata, say) have no FDE.
static int returns_into_function(unwind_state *state, uintptr_t address) {
    if (!follows_call(state, address)) return 0;
    unw_proc_info_t info;
    memset(&info, 0, sizeof info);
    return find_proc_info(address_space, (unw_word_t)(address - 1), &info, 0, state) == 0 &&
           info.start_ip <= address - 1 && address - 1 < info.end_ip;
}

/// Whether `bp` holds a saved frame pointer and a return address above `sp`.
static int plausible_frame(unwind_state *state, uintptr_t sp, uintptr_t bp) {
    if (bp < sp || bp - sp > (1u << 20) || (bp & 7) != 0) return 0;
    uintptr_t saved[2];
    if (read_memory(state, bp, saved, sizeof saved) != 0) return 0;
    if (saved[0] != 0 && saved[0] <= bp) return 0;
    return saved[1] != 0 && returns_into_function(state, saved[1]);
}

/// Frame size from the function's prologue: [endbr64] push rbp; mov rbp,rsp; push …; [sub rsp,N].
static int prologue_frame_size(unwind_state *state, uintptr_t start, uintptr_t *size) {
    unsigned char code[32];
    if (read_memory(state, start, code, sizeof code) != 0) return -1;
    size_t at = 0;
    if (code[0] == 0xf3 && code[1] == 0x0f && code[2] == 0x1e && code[3] == 0xfa) at = 4;
    if (code[at] != 0x55) return -1;
    at++;
    if (!(code[at] == 0x48 && (code[at + 1] == 0x89 || code[at + 1] == 0x8b) &&
          (code[at + 2] == 0xe5 || code[at + 2] == 0xec)))
        return -1;
    at += 3;
    uintptr_t bytes = 0;
    for (;;) {
        if (at + 1 < sizeof code && code[at] == 0x41 && code[at + 1] >= 0x50 && code[at + 1] <= 0x57) {
            bytes += 8;
            at += 2;
        } else if (at < sizeof code && code[at] >= 0x50 && code[at] <= 0x57 && code[at] != 0x54) {
            bytes += 8;
            at += 1;
        } else {
            break;
        }
    }
    if (at + 3 < sizeof code && code[at] == 0x48 && code[at + 1] == 0x83 && code[at + 2] == 0xec) {
        bytes += code[at + 3];
    } else if (at + 6 < sizeof code && code[at] == 0x48 && code[at + 1] == 0x81 && code[at + 2] == 0xec) {
        uint32_t immediate;
        memcpy(&immediate, code + at + 3, 4);
        bytes += immediate;
    }
    *size = bytes;
    return 0;
}

/// A candidate saved-rbp/return-address pair may be a stale one, left in the frame's locals by a
/// call the function made earlier (or by that call's callees): its chain of saved frame pointers
/// then reaches a pair that returns into the function itself, and that pair's saved rbp is the
/// function's own frame pointer. (A recursive function loses one level to this; a stale pair left
/// by the caller's earlier calls is not caught, and only gives the caller's frame another line.)
static uintptr_t resolve_stale_pair(unwind_state *state, uintptr_t sp, uintptr_t candidate, uintptr_t start,
                                    uintptr_t end) {
    uintptr_t pair = candidate;
    for (int hop = 0; hop < 16; hop++) {
        uintptr_t saved[2];
        if (read_memory(state, pair, saved, sizeof saved) != 0) break;
        if (saved[1] >= start && saved[1] < end) {
            return plausible_frame(state, sp, saved[0]) ? saved[0] : 0;
        }
        if (!plausible_frame(state, sp, saved[0])) break;
        pair = saved[0];
    }
    return candidate;
}

/// The frame pointer of the frame at `sp` whose function spans [`start`, `end`), or 0: the first
/// plausible one after passing over `skip` others (when the first led the unwind astray).
static uintptr_t recover_frame_pointer(unwind_state *state, uintptr_t sp, uintptr_t start, uintptr_t end, int skip) {
    uintptr_t size;
    // The prologue's frame size holds unless the function moved rsp since (a dynamic allocation,
    // as Swift makes for values of generic size): then the pair there is checked like any other.
    if (start != 0 && prologue_frame_size(state, start, &size) == 0 && plausible_frame(state, sp, sp + size)) {
        uintptr_t bp = resolve_stale_pair(state, sp, sp + size, start, end);
        if (bp != 0 && skip-- == 0) return bp;
    }
    for (uintptr_t candidate = (sp + 7) & ~(uintptr_t)7; candidate < sp + 4096; candidate += 8) {
        if (!plausible_frame(state, sp, candidate)) continue;
        uintptr_t bp = resolve_stale_pair(state, sp, candidate, start, end);
        if (bp != 0 && skip-- == 0) return bp;
    }
    return 0;
}

// MARK: - Unwinding

/// One unwind from the registers in `start`; the first frame pointer recovered is the `skip`-th
/// plausible one. `*clean` tells whether it reached the outermost frame (or `max_frames`) rather
/// than an error.
static int unwind_once(const unwind_state *start, int skip, int max_frames, uintptr_t *frames, int *frame_count,
                       int *truncated, int *recovered, int *clean) {
    *frame_count = 0;
    *truncated = 0;
    *recovered = 0;
    *clean = 0;

    // 4 KiB of memory cache, on the caller's stack (the watchdog's has 512 KiB).
    unwind_state storage;
    unwind_state *state = &storage;
    memcpy(state->registers, start->registers, sizeof state->registers);
    state->known = start->known;
    state->copy = start->copy;
    state->copy_start = start->copy_start;
    state->copy_length = start->copy_length;
    state->copy_limit = start->copy_limit;
    memset(state->valid, 0, sizeof state->valid);

    int count = 0;
    int result = 0;
    int skip_first = 0;  // after a recovery, the cursor starts at a frame already recorded
    while (count < max_frames) {
        unw_cursor_t cursor;
        int rc = unw_init_remote(&cursor, address_space, state);
        if (rc != 0) {
            result = rc;
            break;
        }
        for (;;) {
            unw_word_t ip = 0;
            if (unw_get_reg(&cursor, UNW_REG_IP, &ip) < 0 || ip == 0) {
                rc = 0;
                break;
            }
            if (skip_first) {
                skip_first = 0;
            } else {
                if (count == max_frames) {
                    *truncated = 1;
                    rc = 0;
                    break;
                }
                frames[count++] = (uintptr_t)ip;
            }
            rc = unw_step(&cursor);
            if (rc <= 0) break;
        }
        if (rc >= 0 || count == max_frames) {
            *clean = 1;
            break;
        }
        // The step out of the innermost frame seen failed. When that frame takes its CFA from a
        // frame pointer nobody knows yet, recover it and go on from there.
        unw_word_t frame_sp = 0, frame_ip = 0;
        unw_proc_info_t info;
        memset(&info, 0, sizeof info);
        if (*recovered >= 4 || unw_get_reg(&cursor, UNW_REG_SP, &frame_sp) < 0 ||
            unw_get_reg(&cursor, UNW_REG_IP, &frame_ip) < 0 || unw_get_proc_info(&cursor, &info) < 0) {
            result = rc;
            break;
        }
        uintptr_t bp = recover_frame_pointer(state, (uintptr_t)frame_sp, (uintptr_t)info.start_ip,
                                             (uintptr_t)info.end_ip, *recovered == 0 ? skip : 0);
        int had_bp = (state->known & (1u << UNW_X86_64_RBP)) != 0;
        if (bp == 0 || (had_bp && bp == state->registers[UNW_X86_64_RBP] &&
                        state->registers[UNW_X86_64_RSP] == frame_sp)) {
            result = rc;
            break;
        }
        // From here on only sp, pc and the recovered rbp are known.
        state->known = (1u << UNW_X86_64_RSP) | (1u << UNW_X86_64_RIP) | (1u << UNW_X86_64_RBP);
        state->registers[UNW_X86_64_RSP] = (uintptr_t)frame_sp;
        state->registers[UNW_X86_64_RIP] = (uintptr_t)frame_ip;
        state->registers[UNW_X86_64_RBP] = bp;
        skip_first = 1;
        *recovered += 1;
    }
    *frame_count = count;
    return count > 0 ? 0 : (result < 0 ? result : -UNW_ENOINFO);
}

enum { MAX_ATTEMPTS = 4, MAX_UNWOUND_FRAMES = 256 };

// A recovered frame pointer can be a stale saved-rbp/return-address pair that passes every check
// and leads the unwind into an error a frame or two later, which leaves a short stack that names
// no callout. Such an unwind is tried again from the next plausible frame pointer; the first that
// reaches the outermost frame wins, and when none does, the first attempt stands.
static int unwind(const unwind_state *start, int max_frames, uintptr_t *frames, int *frame_count, int *truncated,
                  int *recovered) {
    if (stallmon_memory_open() < 0) return -UNW_EINVAL;
    if (begin_unwinding() != 0) return -UNW_ENOMEM;
    if (max_frames > MAX_UNWOUND_FRAMES) max_frames = MAX_UNWOUND_FRAMES;
    int clean = 0;
    int result = unwind_once(start, 0, max_frames, frames, frame_count, truncated, recovered, &clean);
    for (int attempt = 1; attempt < MAX_ATTEMPTS && result == 0 && !clean && *recovered > 0; attempt++) {
        uintptr_t retry[MAX_UNWOUND_FRAMES];
        int count = 0, retry_truncated = 0, retry_recovered = 0;
        int rc = unwind_once(start, attempt, max_frames, retry, &count, &retry_truncated, &retry_recovered, &clean);
        if (rc != 0 || retry_recovered == 0) break;  // no further candidate
        if (clean) {
            memcpy(frames, retry, (size_t)count * sizeof *retry);
            *frame_count = count;
            *truncated = retry_truncated;
            *recovered = retry_recovered;
        }
    }
    end_unwinding();
    return result;
}

int stallmon_unwind_blocked(uintptr_t sp, uintptr_t pc, int max_frames, uintptr_t *frames, int *frame_count,
                            int *truncated, int *recovered) {
    unwind_state start = {.known = (1u << UNW_X86_64_RSP) | (1u << UNW_X86_64_RIP)};
    start.registers[UNW_X86_64_RSP] = sp;
    start.registers[UNW_X86_64_RIP] = pc;
    return unwind(&start, max_frames, frames, frame_count, truncated, recovered);
}

int stallmon_unwind_copied(const stallmon_captured_registers *registers, const void *stack, size_t length,
                           uintptr_t stack_limit, int max_frames, uintptr_t *frames, int *frame_count,
                           int *truncated) {
    unwind_state start = {.known = 0};
    static const int order[] = {UNW_X86_64_RAX, UNW_X86_64_RDX, UNW_X86_64_RCX, UNW_X86_64_RBX,
                                UNW_X86_64_RSI, UNW_X86_64_RDI, UNW_X86_64_RBP, UNW_X86_64_RSP,
                                UNW_X86_64_R8,  UNW_X86_64_R9,  UNW_X86_64_R10, UNW_X86_64_R11,
                                UNW_X86_64_R12, UNW_X86_64_R13, UNW_X86_64_R14, UNW_X86_64_R15,
                                UNW_X86_64_RIP};
    for (int i = 0; i < STALLMON_CAPTURED_REGISTER_COUNT; i++) {
        start.registers[order[i]] = registers->values[i];
        start.known |= 1u << order[i];
    }
    start.copy = stack;
    start.copy_start = registers->values[STALLMON_CAPTURED_SP];
    start.copy_length = length;
    start.copy_limit = stack_limit > start.copy_start + length ? stack_limit : start.copy_start + length;
    int recovered = 0;
    return unwind(&start, max_frames, frames, frame_count, truncated, &recovered);
}

#else

int stallmon_unwind_blocked(uintptr_t sp, uintptr_t pc, int max_frames, uintptr_t *frames, int *frame_count,
                            int *truncated, int *recovered) {
    (void)sp;
    (void)pc;
    (void)max_frames;
    (void)frames;
    *frame_count = 0;
    *truncated = 0;
    *recovered = 0;
    return -UNW_EUNSPEC;  // only x86_64's registers are mapped so far
}

int stallmon_unwind_copied(const stallmon_captured_registers *registers, const void *stack, size_t length,
                           uintptr_t stack_limit, int max_frames, uintptr_t *frames, int *frame_count,
                           int *truncated) {
    (void)registers;
    (void)stack;
    (void)length;
    (void)stack_limit;
    (void)max_frames;
    (void)frames;
    *frame_count = 0;
    *truncated = 0;
    return -UNW_EUNSPEC;
}

static void unwinding_child(void) {}

#endif

// fork() while the watchdog holds the module table's lock would leave it held in the child for good.
static void modules_prepare(void) { stallmon_modules_lock(); }
static void modules_parent(void) { stallmon_modules_unlock(); }
static void modules_child(void) {
    stallmon_modules_reset_in_child();
    stallmon_memory_reopen_in_child();
    unwinding_child();
}

static pthread_once_t fork_handlers_once = PTHREAD_ONCE_INIT;
static void register_fork_handlers(void) { pthread_atfork(modules_prepare, modules_parent, modules_child); }
void stallmon_unwind_register_fork_handlers(void) { pthread_once(&fork_handlers_once, register_fork_handlers); }

#endif  // STALLMON_LINUX
