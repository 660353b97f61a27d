// Unwinding a thread that is blocked in a system call, without signalling it.
//
// While a thread blocks in the kernel, /proc/self/task/<tid>/syscall shows its user stack pointer
// and program counter. Its stack is memory of this process, so the watchdog can unwind it in
// place: libunwind's remote interface with accessors that read this process's memory through
// /proc/self/mem (an unmapped address is an error, never a fault) and find unwind tables in the
// loaded images' .eh_frame_hdr (DWARF CFI).
//
// Only sp and pc are known. glibc's syscall wrappers keep their CFA sp-relative, so the first
// frames unwind; the callee-saved registers are unknown and reported as unavailable to libunwind.
// Swift functions (and other code built with frame pointers) take their CFA from rbp, which a
// blocked thread keeps in a register the kernel does not show. When a step fails for want of it,
// the frame pointer of that frame is recovered from its function's prologue (push rbp; mov rbp,
// rsp; pushes; sub rsp, N gives rbp = sp + 8·pushes + N) or, failing that, by scanning the frame for
// a saved-rbp/return-address pair; either is accepted only when the return address follows a call
// instruction inside code that the unwind tables cover. From there CFI restores rbp frame by frame, and the unwind goes on.
//
// This runs on the watchdog thread, never in a signal handler: it may lock and allocate.

#define _GNU_SOURCE
#include "stallcapture.h"

#if defined(STALLMON_LINUX)

#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>
#include <libunwind.h>

#if defined(__x86_64__)

// Exported by libunwind's generic library (libunwind-ptrace uses it the same way), not declared
// in its headers: searches a binary-search table of an .eh_frame_hdr through the accessors.
extern int UNW_OBJ(dwarf_search_unwind_table)(unw_addr_space_t as, unw_word_t ip, unw_dyn_info_t *di,
                                              unw_proc_info_t *pi, int need_unwind_info, void *arg);

// MARK: - Reading this process's memory safely

enum { BLOCK_SIZE = 64, BLOCK_COUNT = 64 };

typedef struct {
    int memory;  // /proc/self/mem
    uintptr_t sp, pc, bp;
    int have_bp;
    uintptr_t tags[BLOCK_COUNT];
    unsigned char valid[BLOCK_COUNT];
    unsigned char blocks[BLOCK_COUNT][BLOCK_SIZE];
} unwind_state;

static int read_block(unwind_state *state, uintptr_t block, const unsigned char **out) {
    unsigned index = (unsigned)((block / BLOCK_SIZE) % BLOCK_COUNT);
    if (!(state->valid[index] && state->tags[index] == block)) {
        ssize_t count;
        do {
            count = pread(state->memory, state->blocks[index], BLOCK_SIZE, (off_t)block);
        } while (count < 0 && errno == EINTR);
        if (count != BLOCK_SIZE) {
            state->valid[index] = 0;
            return -1;
        }
        state->tags[index] = block;
        state->valid[index] = 1;
    }
    *out = state->blocks[index];
    return 0;
}

/// Copies `length` bytes at `address` of this process; -1 when any of them is not mapped.
static int read_memory(unwind_state *state, uintptr_t address, void *buffer, size_t length) {
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

static int read_word(unwind_state *state, uintptr_t address, uintptr_t *value) {
    return read_memory(state, address, value, sizeof *value);
}

// MARK: - Unwind tables of the loaded images

typedef struct {
    uintptr_t start, end;  // executable segments
    uintptr_t header;      // .eh_frame_hdr
    uintptr_t table;       // its binary-search table
    uintptr_t count;       // entries in the table
} module_t;

enum { MODULE_CAPACITY = 512 };
static module_t modules[MODULE_CAPACITY];
static int module_count;
static pthread_mutex_t modules_lock = PTHREAD_MUTEX_INITIALIZER;

static int read_encoded_u32(const unsigned char *pointer, unsigned char encoding, uintptr_t *value) {
    // The header's own fields: 4-byte encodings only (what every linker writes).
    if ((encoding & 0x0f) != 0x03 && (encoding & 0x0f) != 0x0b) return -1;
    int32_t raw;
    memcpy(&raw, pointer, 4);
    *value = (encoding & 0x0f) == 0x03 ? (uintptr_t)(uint32_t)raw : (uintptr_t)(intptr_t)raw;
    return 0;
}

static int add_module(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    (void)data;
    if (module_count == MODULE_CAPACITY) return 1;
    module_t module = {0};
    module.start = UINTPTR_MAX;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *header = &info->dlpi_phdr[i];
        uintptr_t address = info->dlpi_addr + header->p_vaddr;
        if (header->p_type == PT_LOAD && (header->p_flags & PF_X)) {
            if (address < module.start) module.start = address;
            if (address + header->p_memsz > module.end) module.end = address + header->p_memsz;
        } else if (header->p_type == PT_GNU_EH_FRAME) {
            module.header = address;
        }
    }
    if (module.header == 0 || module.start >= module.end) return 0;
    // version, eh_frame_ptr encoding, fde_count encoding, table encoding; then eh_frame_ptr and
    // fde_count; then the table of (initial location, FDE) pairs, datarel sdata4.
    const unsigned char *header = (const unsigned char *)module.header;
    if (header[0] != 1 || header[3] != 0x3b) return 0;
    uintptr_t ignored, count;
    if (read_encoded_u32(header + 4, header[1], &ignored) != 0) return 0;
    if (read_encoded_u32(header + 8, header[2], &count) != 0) return 0;
    module.table = module.header + 12;
    module.count = count;
    modules[module_count++] = module;
    return 0;
}

static int find_module(uintptr_t ip, module_t *out) {
    pthread_mutex_lock(&modules_lock);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < module_count; i++) {
            if (ip >= modules[i].start && ip < modules[i].end) {
                *out = modules[i];
                pthread_mutex_unlock(&modules_lock);
                return 0;
            }
        }
        if (pass == 0) {
            // Not known yet (or loaded since): list the images again.
            module_count = 0;
            dl_iterate_phdr(add_module, NULL);
        }
    }
    pthread_mutex_unlock(&modules_lock);
    return -1;
}

// MARK: - Accessors

static int find_proc_info(unw_addr_space_t space, unw_word_t ip, unw_proc_info_t *info, int need_unwind_info,
                          void *arg) {
    module_t module;
    if (find_module((uintptr_t)ip, &module) != 0) return -UNW_ENOINFO;
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
    if (read_word(arg, (uintptr_t)address, &word) != 0) return -UNW_EINVAL;
    *value = word;
    return 0;
}

static int access_reg(unw_addr_space_t space, unw_regnum_t reg, unw_word_t *value, int write, void *arg) {
    (void)space;
    unwind_state *state = arg;
    if (write) return -UNW_EREADONLYREG;
    switch (reg) {
    case UNW_X86_64_RSP: *value = state->sp; return 0;
    case UNW_X86_64_RIP: *value = state->pc; return 0;
    case UNW_X86_64_RBP:
        if (!state->have_bp) return -UNW_EBADREG;
        *value = state->bp;
        return 0;
    default: return -UNW_EBADREG;  // the kernel does not show it
    }
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

static unw_addr_space_t address_space;
static pthread_once_t address_space_once = PTHREAD_ONCE_INIT;

static void create_address_space(void) {
    address_space = unw_create_addr_space(&accessors, 0);
    if (address_space) unw_set_caching_policy(address_space, UNW_CACHE_GLOBAL);
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

/// One unwind from sp and pc; the first frame pointer recovered is the `skip`-th plausible one.
/// `*clean` tells whether it reached the outermost frame (or `max_frames`) rather than an error.
static int unwind_once(uintptr_t sp, uintptr_t pc, int skip, int max_frames, uintptr_t *frames, int *frame_count,
                       int *truncated, int *recovered, int *clean) {
    *frame_count = 0;
    *truncated = 0;
    *recovered = 0;
    *clean = 0;

    // 4 KiB of memory cache, on the caller's stack (the watchdog's has 512 KiB).
    unwind_state storage;
    unwind_state *state = &storage;
    memset(state->valid, 0, sizeof state->valid);
    state->memory = open("/proc/self/mem", O_RDONLY | O_CLOEXEC);
    if (state->memory < 0) return -UNW_EINVAL;
    state->sp = sp;
    state->pc = pc;
    state->have_bp = 0;

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
        if (bp == 0 || (state->have_bp && bp == state->bp && state->sp == frame_sp)) {
            result = rc;
            break;
        }
        state->sp = (uintptr_t)frame_sp;
        state->pc = (uintptr_t)frame_ip;
        state->bp = bp;
        state->have_bp = 1;
        skip_first = 1;
        *recovered += 1;
    }
    close(state->memory);
    state->memory = -1;
    *frame_count = count;
    return count > 0 ? 0 : (result < 0 ? result : -UNW_ENOINFO);
}

enum { MAX_ATTEMPTS = 4, MAX_BLOCKED_FRAMES = 256 };

// A recovered frame pointer can be a stale saved-rbp/return-address pair that passes every check
// and leads the unwind into an error a frame or two later, which leaves a short stack that names
// no callout. Such an unwind is tried again from the next plausible frame pointer; the first that
// reaches the outermost frame wins, and when none does, the first attempt stands, as before.
int stallmon_unwind_blocked(uintptr_t sp, uintptr_t pc, int max_frames, uintptr_t *frames, int *frame_count,
                            int *truncated, int *recovered) {
    pthread_once(&address_space_once, create_address_space);
    if (address_space == NULL) return -UNW_ENOMEM;
    if (max_frames > MAX_BLOCKED_FRAMES) max_frames = MAX_BLOCKED_FRAMES;
    int clean = 0;
    int result = unwind_once(sp, pc, 0, max_frames, frames, frame_count, truncated, recovered, &clean);
    for (int attempt = 1; attempt < MAX_ATTEMPTS && result == 0 && !clean && *recovered > 0; attempt++) {
        uintptr_t retry[MAX_BLOCKED_FRAMES];
        int count = 0, retry_truncated = 0, retry_recovered = 0;
        int rc = unwind_once(sp, pc, attempt, max_frames, retry, &count, &retry_truncated, &retry_recovered, &clean);
        if (rc != 0 || retry_recovered == 0) break;  // no further candidate
        if (clean) {
            memcpy(frames, retry, (size_t)count * sizeof *retry);
            *frame_count = count;
            *truncated = retry_truncated;
            *recovered = retry_recovered;
        }
    }
    return result;
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

#endif

#endif  // STALLMON_LINUX
