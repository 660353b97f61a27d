// The module table of the unwinder (remote_unwind.c): the images loaded in this process, each
// with its executable range and the binary-search table of its .eh_frame_hdr, found from
// /proc/self/maps and the ELF headers it maps, read through /proc/self/mem. Nothing here calls
// dl_iterate_phdr or takes the dynamic loader's lock. The table is listed again whenever an
// address falls outside every image known (one loaded since).
//
// Watchdog side only, under the table's lock; fork handlers in remote_unwind.c.

#define _GNU_SOURCE
#include "stallcapture.h"
#include "unwind.h"

#if defined(STALLMON_LINUX)

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MODULE_CAPACITY = 512 };
static stallmon_module modules[MODULE_CAPACITY];
static int module_count;
static pthread_mutex_t modules_lock = PTHREAD_MUTEX_INITIALIZER;

static int read_exact(uintptr_t address, void *buffer, size_t length) {
    return stallmon_memory_read(buffer, length, address) == (ssize_t)length ? 0 : -1;
}

static int read_encoded_u32(const unsigned char *pointer, unsigned char encoding, uintptr_t *value) {
    // The header's own fields: 4-byte encodings only (what every linker writes).
    if ((encoding & 0x0f) != 0x03 && (encoding & 0x0f) != 0x0b) return -1;
    int32_t raw;
    memcpy(&raw, pointer, 4);
    *value = (encoding & 0x0f) == 0x03 ? (uintptr_t)(uint32_t)raw : (uintptr_t)(intptr_t)raw;
    return 0;
}

/// Adds the image whose ELF header is mapped at `base` and one of whose executable segments is
/// mapped at `mapped` from file offset `offset` (the load bias follows from that segment).
static void add_image(uintptr_t base, uintptr_t mapped, uintptr_t offset) {
    if (module_count == MODULE_CAPACITY) return;
    ElfW(Ehdr) elf;
    if (read_exact(base, &elf, sizeof elf) != 0) return;
    if (memcmp(elf.e_ident, ELFMAG, SELFMAG) != 0 || elf.e_ident[EI_CLASS] != ELFCLASS64 ||
        elf.e_phentsize != sizeof(ElfW(Phdr)) || elf.e_phnum == 0 || elf.e_phnum > 64)
        return;
    ElfW(Phdr) headers[64];
    if (read_exact(base + elf.e_phoff, headers, sizeof(ElfW(Phdr)) * elf.e_phnum) != 0) return;
    // The segment mapped at `mapped`: its page-aligned file offset is the mapping's offset.
    uintptr_t bias = 0;
    int found = 0;
    for (int i = 0; i < elf.e_phnum && !found; i++) {
        const ElfW(Phdr) *header = &headers[i];
        if (header->p_type != PT_LOAD || !(header->p_flags & PF_X)) continue;
        uintptr_t page_mask = (uintptr_t)sysconf(_SC_PAGESIZE) - 1;
        if ((header->p_offset & ~page_mask) != offset) continue;
        bias = mapped - (header->p_vaddr & ~page_mask);
        found = 1;
    }
    if (!found) return;
    stallmon_module module = {.start = UINTPTR_MAX};
    for (int i = 0; i < elf.e_phnum; i++) {
        const ElfW(Phdr) *header = &headers[i];
        uintptr_t address = bias + header->p_vaddr;
        if (header->p_type == PT_LOAD && (header->p_flags & PF_X)) {
            if (address < module.start) module.start = address;
            if (address + header->p_memsz > module.end) module.end = address + header->p_memsz;
        } else if (header->p_type == PT_GNU_EH_FRAME) {
            module.header = address;
        }
    }
    if (module.header == 0 || module.start >= module.end) return;
    for (int i = 0; i < module_count; i++) {
        if (modules[i].start == module.start) return;  // another executable segment of an image listed
    }
    // version, eh_frame_ptr encoding, fde_count encoding, table encoding; then eh_frame_ptr and
    // fde_count; then the table of (initial location, FDE) pairs, datarel sdata4.
    unsigned char header[12];
    if (read_exact(module.header, header, sizeof header) != 0) return;
    if (header[0] != 1 || header[3] != 0x3b) return;
    uintptr_t ignored, count;
    if (read_encoded_u32(header + 4, header[1], &ignored) != 0) return;
    if (read_encoded_u32(header + 8, header[2], &count) != 0) return;
    module.table = module.header + 12;
    module.count = count;
    modules[module_count++] = module;
}

/// One line of /proc/self/maps: "start-end perms offset major:minor inode [path]".
typedef struct {
    uintptr_t start, end, offset;
    unsigned long inode;
    char device[16];
    int executable;
    int vdso;
} map_line;

static int parse_map_line(const char *line, map_line *out) {
    char perms[8] = {0};
    int consumed = 0;
    unsigned long start, end, offset, inode;
    if (sscanf(line, "%lx-%lx %7s %lx %15s %lu %n", &start, &end, perms, &offset, out->device, &inode, &consumed) <
        6)
        return -1;
    out->start = start;
    out->end = end;
    out->offset = offset;
    out->inode = inode;
    out->executable = perms[2] == 'x';
    out->vdso = strncmp(line + consumed, "[vdso]", 6) == 0;
    return 0;
}

/// Lists the images again from /proc/self/maps. The file's lines come in address order and an
/// image's segments one after another, the one at file offset 0 (holding the ELF header) first.
static void list_images(void) {
    module_count = 0;
    int descriptor = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (descriptor < 0) return;
    size_t capacity = 1 << 16, used = 0;
    char *text = malloc(capacity);
    if (text == NULL) {
        close(descriptor);
        return;
    }
    uintptr_t base = 0;
    unsigned long base_inode = 0;
    char base_device[16] = {0};
    for (;;) {
        ssize_t count = read(descriptor, text + used, capacity - used - 1);
        if (count < 0 && errno == EINTR) continue;
        if (count <= 0) break;
        used += (size_t)count;
        text[used] = 0;
        char *line = text;
        char *newline;
        while ((newline = memchr(line, '\n', used - (size_t)(line - text))) != NULL) {
            *newline = 0;
            map_line map;
            if (parse_map_line(line, &map) == 0) {
                if (map.vdso) {
                    if (map.executable) add_image(map.start, map.start, map.offset);
                } else if (map.inode != 0) {
                    if (map.offset == 0) {
                        base = map.start;
                        base_inode = map.inode;
                        memcpy(base_device, map.device, sizeof base_device);
                    }
                    if (map.executable && base != 0 && map.inode == base_inode &&
                        strcmp(map.device, base_device) == 0) {
                        add_image(base, map.start, map.offset);
                    }
                }
            }
            line = newline + 1;
        }
        // Keep the partial last line for the next read.
        size_t rest = used - (size_t)(line - text);
        memmove(text, line, rest);
        used = rest;
        if (used + 1 >= capacity) break;  // a line longer than the buffer: give up on the rest
    }
    free(text);
    close(descriptor);
}

int stallmon_module_find(uintptr_t ip, stallmon_module *out) {
    pthread_mutex_lock(&modules_lock);
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < module_count; i++) {
            if (ip >= modules[i].start && ip < modules[i].end) {
                *out = modules[i];
                pthread_mutex_unlock(&modules_lock);
                return 0;
            }
        }
        // Not known yet (or loaded since): list the images again.
        if (pass == 0) list_images();
    }
    pthread_mutex_unlock(&modules_lock);
    return -1;
}

int stallmon_module_count(void) {
    pthread_mutex_lock(&modules_lock);
    list_images();
    int count = module_count;
    pthread_mutex_unlock(&modules_lock);
    return count;
}

void stallmon_modules_lock(void) { pthread_mutex_lock(&modules_lock); }
void stallmon_modules_unlock(void) { pthread_mutex_unlock(&modules_lock); }

void stallmon_modules_reset_in_child(void) {
    pthread_mutex_init(&modules_lock, NULL);
    module_count = 0;  // the child maps what the parent did, but lists them itself when it needs to
}

#endif  // STALLMON_LINUX
