#define _GNU_SOURCE
#include "symbolize.h"

#if defined(STALLMON_LINUX)

#include <dlfcn.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

// Exported by libswiftCore; declared here because no public header carries it.
extern char *swift_demangle(const char *mangled_name, size_t mangled_name_length, char *output_buffer,
                            size_t *output_buffer_size, uint32_t flags);

struct stallmon_symbolizer {
    Dwfl *dwfl;
    pid_t pid;
    // Modules lookups have touched since the last trim (the others' files were never read).
    Dwfl_Module *touched[128];
    size_t touched_count;
};

static void note_touched(stallmon_symbolizer *symbolizer, Dwfl_Module *module) {
    for (size_t i = 0; i < symbolizer->touched_count; i++) {
        if (symbolizer->touched[i] == module) return;
    }
    if (symbolizer->touched_count < sizeof symbolizer->touched / sizeof symbolizer->touched[0]) {
        symbolizer->touched[symbolizer->touched_count++] = module;
    }
}

static char *debuginfo_path = NULL;

// The vDSO has no debug info anywhere, and looking for it costs megabytes (a search by build id
// through every debug path): its symbols come from its own image.
static int find_debuginfo(Dwfl_Module *module, void **userdata, const char *name, Dwarf_Addr base,
                          const char *file, const char *debuglink, GElf_Word crc, char **debuginfo_name) {
    if (name != NULL && strncmp(name, "[vdso", 5) == 0) return -1;
    return dwfl_standard_find_debuginfo(module, userdata, name, base, file, debuglink, crc, debuginfo_name);
}

static const Dwfl_Callbacks callbacks = {
    .find_elf = dwfl_linux_proc_find_elf,
    .find_debuginfo = find_debuginfo,
    .debuginfo_path = &debuginfo_path,
};

// MARK: - CU lookup without .debug_aranges
//
// Swift and clang emit DWARF 5 without .debug_aranges, and elfutils 0.188's address-to-CU lookup
// then finds nothing. This index walks the units once per module and records their ranges.

typedef struct {
    Dwarf_Addr low;
    Dwarf_Addr high;
    Dwarf_Off die_offset;
} cu_range;

/// A function symbol a lookup found: `dwfl_module_addrinfo` searches the whole symbol table
/// (about 1–2 ms in a large Swift image), and the samples of a stall that burns CPU land at a new
/// address of the same few functions each time.
typedef struct {
    Dwarf_Addr low;
    Dwarf_Addr high;
    const char *name;  // in the module's string table (valid while the module is), or `owned`
    char *owned;       // a name read from the file, freed with the entry
} function_range;

enum { FUNCTION_CACHE_COUNT = 64 };

/// What the symbolizer keeps of a module (its libdwfl userdata), made on first use.
typedef struct {
    int embedded;  // the module's own file carries DWARF (has_embedded_dwarf)
    Dwarf *dwarf;  // with it, the address ranges of its compile units
    Dwarf_Addr bias;
    cu_range *ranges;
    size_t count;
    function_range functions[FUNCTION_CACHE_COUNT];
    unsigned next_function;  // the entry the next function found replaces
} cu_index;

static int compare_ranges(const void *lhs, const void *rhs) {
    const cu_range *a = lhs, *b = rhs;
    return a->low < b->low ? -1 : a->low > b->low ? 1 : 0;
}

static int has_embedded_dwarf(Dwfl_Module *module);
static void release_image_pages(Elf *elf);

static cu_index *build_index(Dwfl_Module *module) {
    cu_index *index = calloc(1, sizeof *index);
    if (index == NULL) return NULL;
    index->embedded = has_embedded_dwarf(module);
    if (!index->embedded) return index;
    index->dwarf = dwfl_module_getdwarf(module, &index->bias);
    if (index->dwarf == NULL) return index;
    size_t capacity = 0;
    Dwarf_Off offset = 0, next;
    size_t header_size;
    while (dwarf_next_unit(index->dwarf, offset, &next, &header_size, NULL, NULL, NULL, NULL, NULL, NULL) == 0) {
        Dwarf_Die cu;
        if (dwarf_offdie(index->dwarf, offset + header_size, &cu) != NULL) {
            Dwarf_Addr base, low, high;
            ptrdiff_t cursor = 0;
            while ((cursor = dwarf_ranges(&cu, cursor, &base, &low, &high)) > 0) {
                // Empty ranges, and code the linker discarded (resolved to address 0), claim nothing.
                if (high <= low || low == 0) continue;
                if (index->count == capacity) {
                    capacity = capacity ? capacity * 2 : 256;
                    cu_range *grown = realloc(index->ranges, capacity * sizeof *grown);
                    if (grown == NULL) break;
                    index->ranges = grown;
                }
                index->ranges[index->count++] = (cu_range){low, high, offset + header_size};
            }
        }
        offset = next;
    }
    qsort(index->ranges, index->count, sizeof *index->ranges, compare_ranges);
    // The walk read every unit's header and ranges: all of .debug_info and .debug_ranges, 2.7 MB
    // of the benchmark's executable, of which a lookup needs a unit or two. Its pages leave the
    // resident set now rather than at the next trim (the first report's resident memory).
    release_image_pages(dwarf_getelf(index->dwarf));
    return index;
}

static void free_index(cu_index *index) {
    if (index == NULL) return;
    for (int i = 0; i < FUNCTION_CACHE_COUNT; i++) free(index->functions[i].owned);
    free(index->ranges);
    free(index);
}

// The CU containing `address` (a module-relative address, bias already removed).
static int find_cu(cu_index *index, Dwarf_Addr address, Dwarf_Die *out) {
    size_t low = 0, high = index->count;
    while (low < high) {
        size_t middle = low + (high - low) / 2;
        if (index->ranges[middle].low <= address) low = middle + 1; else high = middle;
    }
    // Ranges may nest or overlap slightly; look back a little from the last range starting before.
    for (size_t i = low; i > 0 && low - i < 64; i--) {
        cu_range *range = &index->ranges[i - 1];
        if (address >= range->low && address < range->high) {
            return dwarf_offdie(index->dwarf, range->die_offset, out) != NULL;
        }
    }
    return 0;
}

// Whether the module's own file carries DWARF. Debug info installed apart from the module (a
// distribution's -dbg package in /usr/lib/debug) still names its symbols, but its DWARF is not
// read: elfutils 0.188 decompresses every debug section of such a file when it opens it, about
// 16 MB for glibc's, all at once, for file:line of library frames that are never a stall's culprit.
static int has_embedded_dwarf(Dwfl_Module *module) {
    Dwarf_Addr bias = 0;
    Elf *elf = dwfl_module_getelf(module, &bias);
    if (elf == NULL) return 0;
    size_t strings;
    if (elf_getshdrstrndx(elf, &strings) != 0) return 0;
    Elf_Scn *section = NULL;
    while ((section = elf_nextscn(elf, section)) != NULL) {
        GElf_Shdr header;
        if (gelf_getshdr(section, &header) == NULL) continue;
        const char *name = elf_strptr(elf, strings, header.sh_name);
        if (name != NULL && strcmp(name, ".debug_info") == 0) return header.sh_type != SHT_NOBITS;
    }
    return 0;
}

static cu_index *module_index(Dwfl_Module *module) {
    void **userdata = NULL;
    dwfl_module_info(module, &userdata, NULL, NULL, NULL, NULL, NULL, NULL);
    if (userdata == NULL) return NULL;
    if (*userdata == NULL) *userdata = build_index(module);
    return *userdata;
}

// MARK: - Function symbols read from the file
//
// libdwfl finds the symbol of an address by a linear pass over the whole symbol table that also
// reads every symbol's name: both tables come into the resident set, 2.5 MB for libFoundation's.
// The pass below reads the symbol table through a small buffer with pread (the page cache holds
// it, the process does not) and then only the one name it needs.

enum { SYMBOL_BATCH = 512 };

/// The file holding `elf` (the module's main file or its separate debug file), opened for reading
/// when it still is the image libelf mapped (same size); -1 otherwise.
static int open_symbol_file(Dwfl_Module *module, Elf *elf) {
    const char *main_file = NULL, *debug_file = NULL;
    dwfl_module_info(module, NULL, NULL, NULL, NULL, NULL, &main_file, &debug_file);
    Dwarf_Addr main_bias = 0;
    const char *path = elf == dwfl_module_getelf(module, &main_bias) ? main_file : debug_file;
    size_t image_size = 0;
    if (path == NULL || elf_rawfile(elf, &image_size) == NULL) return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat status;
    if (fstat(fd, &status) != 0 || (size_t)status.st_size != image_size) {
        close(fd);
        return -1;
    }
    return fd;
}

/// The NUL-terminated string at `offset` of the file (at most 64 KiB), in a new allocation.
static char *read_string(int fd, off_t offset, off_t limit) {
    size_t capacity = 0, length = 0;
    char *text = NULL;
    while (offset + (off_t)length < limit && length < 65536) {
        if (length + 512 > capacity) {
            capacity = capacity ? capacity * 2 : 512;
            char *grown = realloc(text, capacity);
            if (grown == NULL) break;
            text = grown;
        }
        size_t want = capacity - length;
        if ((off_t)want > limit - offset - (off_t)length) want = (size_t)(limit - offset - (off_t)length);
        ssize_t got = pread(fd, text + length, want, offset + (off_t)length);
        if (got <= 0) break;
        char *end = memchr(text + length, '\0', (size_t)got);
        if (end != NULL) return text;
        length += (size_t)got;
    }
    free(text);
    return NULL;
}

static int binding_rank(unsigned char binding) {
    return binding == STB_GLOBAL ? 2 : binding == STB_WEAK ? 1 : 0;
}

/// The sized function symbol containing `address` (module-absolute), read from the file of the
/// module's symbol table: 1 and `*range` when found, 0 when not (then libdwfl's lookup answers).
static int file_function_symbol(Dwfl_Module *module, Dwarf_Addr address, function_range *range) {
    if (dwfl_module_getsymtab(module) < 2) return 0;
    GElf_Sym first;
    GElf_Addr first_address;
    Elf *elf = NULL;
    Dwarf_Addr bias = 0;
    if (dwfl_module_getsym_info(module, 1, &first, &first_address, NULL, &elf, &bias) == NULL || elf == NULL ||
        gelf_getclass(elf) != ELFCLASS64) {
        return 0;
    }
    GElf_Ehdr header;
    if (gelf_getehdr(elf, &header) == NULL || header.e_type == ET_REL) return 0;
    // The symbol table libdwfl reads: .symtab when the file has one, else .dynsym.
    GElf_Shdr symbols = {0}, strings = {0};
    Elf_Scn *section = NULL;
    int found = 0;
    while ((section = elf_nextscn(elf, section)) != NULL) {
        GElf_Shdr candidate;
        if (gelf_getshdr(section, &candidate) == NULL) continue;
        if (candidate.sh_type == SHT_SYMTAB || (candidate.sh_type == SHT_DYNSYM && !found)) {
            Elf_Scn *linked = elf_getscn(elf, candidate.sh_link);
            if (linked == NULL || gelf_getshdr(linked, &strings) == NULL) continue;
            symbols = candidate;
            found = candidate.sh_type == SHT_SYMTAB ? 2 : 1;
        }
    }
    if (!found || symbols.sh_entsize != sizeof(Elf64_Sym) || strings.sh_type != SHT_STRTAB) return 0;
    int fd = open_symbol_file(module, elf);
    if (fd < 0) return 0;
    Dwarf_Addr target = address - bias;
    Elf64_Sym best = {0};
    int have_best = 0;
    Elf64_Sym batch[SYMBOL_BATCH];
    size_t total = symbols.sh_size / sizeof(Elf64_Sym);
    for (size_t done = 0; done < total;) {
        size_t want = total - done < SYMBOL_BATCH ? total - done : SYMBOL_BATCH;
        ssize_t got = pread(fd, batch, want * sizeof(Elf64_Sym), (off_t)(symbols.sh_offset + done * sizeof(Elf64_Sym)));
        if (got <= 0) break;
        size_t count = (size_t)got / sizeof(Elf64_Sym);
        if (count == 0) break;
        for (size_t i = 0; i < count; i++) {
            Elf64_Sym *symbol = &batch[i];
            unsigned char type = ELF64_ST_TYPE(symbol->st_info);
            if ((type != STT_FUNC && type != STT_GNU_IFUNC) || symbol->st_shndx == SHN_UNDEF ||
                symbol->st_size == 0 || target < symbol->st_value || target - symbol->st_value >= symbol->st_size) {
                continue;
            }
            // The innermost symbol, and of aliases the global one, as libdwfl prefers.
            if (!have_best || symbol->st_value > best.st_value ||
                (symbol->st_value == best.st_value &&
                 binding_rank(ELF64_ST_BIND(symbol->st_info)) > binding_rank(ELF64_ST_BIND(best.st_info)))) {
                best = *symbol;
                have_best = 1;
            }
        }
        done += count;
    }
    char *name = have_best && best.st_name < strings.sh_size
                     ? read_string(fd, (off_t)(strings.sh_offset + best.st_name),
                                   (off_t)(strings.sh_offset + strings.sh_size))
                     : NULL;
    close(fd);
    if (name == NULL || name[0] == '\0') {
        free(name);
        return 0;
    }
    *range = (function_range){best.st_value + bias, best.st_value + bias + best.st_size, name, name};
    return 1;
}

/// Keeps `range` among the module's functions found, in place of the oldest.
static void remember_function(cu_index *index, function_range range) {
    function_range *slot = &index->functions[index->next_function++ % FUNCTION_CACHE_COUNT];
    free(slot->owned);
    *slot = range;
}

/// The symbol of the function at `address` (module-absolute), from the functions found before or
/// else from the symbol table; `offset` is the address's offset in it.
static const char *function_symbol(Dwfl_Module *module, cu_index *index, Dwarf_Addr address, GElf_Off *offset) {
    if (index != NULL) {
        for (int i = 0; i < FUNCTION_CACHE_COUNT; i++) {
            function_range *range = &index->functions[i];
            if (range->name != NULL && address >= range->low && address < range->high) {
                *offset = address - range->low;
                return range->name;
            }
        }
        function_range found;
        if (file_function_symbol(module, address, &found)) {
            remember_function(index, found);
            *offset = address - found.low;
            return found.name;
        }
    }
    GElf_Sym elf_symbol;
    const char *name = dwfl_module_addrinfo(module, address, offset, &elf_symbol, NULL, NULL, NULL);
    if (name != NULL && index != NULL && GELF_ST_TYPE(elf_symbol.st_info) == STT_FUNC && elf_symbol.st_size > 0 &&
        *offset < elf_symbol.st_size) {
        remember_function(index, (function_range){address - *offset, address - *offset + elf_symbol.st_size, name, NULL});
    }
    return name;
}

static int free_module_index(Dwfl_Module *module, void **userdata, const char *name, Dwarf_Addr base, void *arg) {
    (void)module;
    (void)name;
    (void)base;
    (void)arg;
    free_index(*userdata);
    *userdata = NULL;
    return DWARF_CB_OK;
}

// Compiler-generated code (cleanups, ARC traffic) carries line 0. Attribute it to the nearest
// earlier row of the same function that has a line, as a reader of the source would.
static void nearest_line(Dwarf_Die *cudie, Dwarf_Addr address, Dwarf_Addr function_start, const char **file,
                         int *line, int *column) {
    Dwarf_Lines *lines;
    size_t count;
    if (dwarf_getsrclines(cudie, &lines, &count) != 0 || count == 0) return;
    size_t low = 0, high = count;
    while (low < high) {  // first row with an address above `address`
        size_t middle = low + (high - low) / 2;
        Dwarf_Addr row_address = 0;
        dwarf_lineaddr(dwarf_onesrcline(lines, middle), &row_address);
        if (row_address <= address) low = middle + 1; else high = middle;
    }
    for (size_t i = low; i > 0; i--) {
        Dwarf_Line *row = dwarf_onesrcline(lines, i - 1);
        Dwarf_Addr row_address = 0;
        bool end_sequence = false;
        dwarf_lineaddr(row, &row_address);
        dwarf_lineendsequence(row, &end_sequence);
        if (row_address < function_start || (end_sequence && i != low)) return;
        int row_line = 0;
        dwarf_lineno(row, &row_line);
        if (row_line > 0) {
            *file = dwarf_linesrc(row, NULL, NULL);
            *line = row_line;
            dwarf_linecol(row, column);
            return;
        }
    }
}

static int report(stallmon_symbolizer *symbolizer) {
    dwfl_report_begin(symbolizer->dwfl);
    int rc = dwfl_linux_proc_report(symbolizer->dwfl, symbolizer->pid);
    if (dwfl_report_end(symbolizer->dwfl, NULL, NULL) != 0) return -1;
    return rc == 0 ? 0 : -1;
}

stallmon_symbolizer *stallmon_symbolizer_create(pid_t pid) {
    stallmon_symbolizer *symbolizer = calloc(1, sizeof *symbolizer);
    if (symbolizer == NULL) return NULL;
    symbolizer->pid = pid;
    symbolizer->dwfl = dwfl_begin(&callbacks);
    if (symbolizer->dwfl == NULL || report(symbolizer) != 0) {
        stallmon_symbolizer_destroy(symbolizer);
        return NULL;
    }
    return symbolizer;
}

void stallmon_symbolizer_destroy(stallmon_symbolizer *symbolizer) {
    if (symbolizer == NULL) return;
    if (symbolizer->dwfl != NULL) {
        dwfl_getmodules(symbolizer->dwfl, free_module_index, NULL, 0);
        dwfl_end(symbolizer->dwfl);
    }
    free(symbolizer);
}

int stallmon_symbolizer_refresh(stallmon_symbolizer *symbolizer) {
    // Modules that stay mapped keep their userdata across reports; indexes of modules that go away
    // would leak, so drop them all and rebuild lazily.
    dwfl_getmodules(symbolizer->dwfl, free_module_index, NULL, 0);
    symbolizer->touched_count = 0;
    return report(symbolizer);
}

static const char *die_name(Dwarf_Die *die) {
    Dwarf_Attribute attribute;
    const char *name = NULL;
    if (dwarf_attr_integrate(die, DW_AT_linkage_name, &attribute) != NULL ||
        dwarf_attr_integrate(die, DW_AT_MIPS_linkage_name, &attribute) != NULL) {
        name = dwarf_formstring(&attribute);
    }
    if (name == NULL) name = dwarf_diename(die);
    if (name == NULL && dwarf_attr_integrate(die, DW_AT_name, &attribute) != NULL) {
        name = dwarf_formstring(&attribute);
    }
    return name;
}

static void call_site(Dwarf_Die *cudie, Dwarf_Die *inlined, const char **file, int *line, int *column) {
    Dwarf_Attribute attribute;
    Dwarf_Word value;
    *file = NULL;
    *line = 0;
    *column = 0;
    if (dwarf_attr(inlined, DW_AT_call_file, &attribute) != NULL && dwarf_formudata(&attribute, &value) == 0) {
        Dwarf_Files *files;
        size_t count;
        if (dwarf_getsrcfiles(cudie, &files, &count) == 0 && value < count) {
            *file = dwarf_filesrc(files, value, NULL, NULL);
        }
    }
    if (dwarf_attr(inlined, DW_AT_call_line, &attribute) != NULL && dwarf_formudata(&attribute, &value) == 0) {
        *line = (int)value;
    }
    if (dwarf_attr(inlined, DW_AT_call_column, &attribute) != NULL && dwarf_formudata(&attribute, &value) == 0) {
        *column = (int)value;
    }
}

int stallmon_symbolize(stallmon_symbolizer *symbolizer, uintptr_t address, int is_return_address,
                       stallmon_symbol *out, int capacity) {
    if (capacity <= 0) return 0;
    Dwarf_Addr lookup = is_return_address && address > 0 ? address - 1 : address;
    Dwfl_Module *module = dwfl_addrmodule(symbolizer->dwfl, lookup);
    if (module == NULL) return 0;
    note_touched(symbolizer, module);

    Dwarf_Addr start = 0;
    const char *module_path = NULL;
    const char *module_name = dwfl_module_info(module, NULL, &start, NULL, NULL, NULL, &module_path, NULL);
    if (module_path == NULL) module_path = module_name;

    cu_index *index = module_index(module);
    GElf_Off offset = 0;
    const char *symbol = function_symbol(module, index, lookup, &offset);

    const char *file = NULL;
    int line = 0, column = 0;
    Dwarf_Die *cudie = NULL;
    Dwarf_Die found_cu;
    Dwarf_Addr bias = 0;
    if (index != NULL && index->dwarf != NULL && find_cu(index, lookup - index->bias, &found_cu)) {
        cudie = &found_cu;
        bias = index->bias;
    }
    if (cudie != NULL) {
        Dwarf_Line *source = dwarf_getsrc_die(cudie, lookup - bias);
        if (source != NULL) {
            file = dwarf_linesrc(source, NULL, NULL);
            dwarf_lineno(source, &line);
            dwarf_linecol(source, &column);
        }
        if (line == 0 && symbol != NULL) {
            Dwarf_Addr function_start = lookup - offset - bias;
            nearest_line(cudie, lookup - bias, function_start, &file, &line, &column);
        }
    }

    int count = 0;
    Dwarf_Die *scopes = NULL;
    int scope_count = cudie != NULL ? dwarf_getscopes(cudie, lookup - bias, &scopes) : 0;
    // Walk the inline chain innermost first: each inlined subroutine is a frame located at the
    // current position, and its call site is the position in the frame that contains it.
    for (int i = 0; i < scope_count && count < capacity - 1; i++) {
        if (dwarf_tag(&scopes[i]) != DW_TAG_inlined_subroutine) continue;
        stallmon_symbol *frame = &out[count++];
        frame->module_path = module_path;
        frame->module_base = (uintptr_t)start;
        frame->symbol = die_name(&scopes[i]);
        frame->symbol_offset = 0;
        frame->file = file;
        frame->line = line;
        frame->column = column;
        frame->inlined = 1;
        call_site(cudie, &scopes[i], &file, &line, &column);
    }
    free(scopes);

    stallmon_symbol *frame = &out[count++];
    frame->module_path = module_path;
    frame->module_base = (uintptr_t)start;
    frame->symbol = symbol;
    frame->symbol_offset = symbol != NULL ? (uintptr_t)offset + (lookup != address ? 1 : 0) : 0;
    frame->file = file;
    frame->line = line;
    frame->column = column;
    frame->inlined = 0;
    return count;
}

typedef struct {
    const char *name;
    uintptr_t start;
    uintptr_t end;
    int found;
} find_request;

static int find_in_module(Dwfl_Module *module, void **userdata, const char *name, Dwarf_Addr base, void *arg) {
    (void)userdata;
    (void)name;
    (void)base;
    find_request *request = arg;
    int count = dwfl_module_getsymtab(module);
    for (int i = 1; i < count; i++) {
        GElf_Sym symbol;
        GElf_Addr address;
        const char *symbol_name = dwfl_module_getsym_info(module, i, &symbol, &address, NULL, NULL, NULL);
        if (symbol_name != NULL && GELF_ST_TYPE(symbol.st_info) == STT_FUNC &&
            strcmp(symbol_name, request->name) == 0) {
            request->start = (uintptr_t)address;
            request->end = (uintptr_t)(address + (symbol.st_size > 0 ? symbol.st_size : 1));
            request->found = 1;
            return DWARF_CB_ABORT;
        }
    }
    return DWARF_CB_OK;
}

int stallmon_symbolizer_find_function(stallmon_symbolizer *symbolizer, const char *name, const char *neighbor,
                                      uintptr_t *start, uintptr_t *end) {
    find_request request = {.name = name};
    // Only the module that holds `neighbor`: every other module's symbol table would be loaded
    // (megabytes each) for nothing.
    void *anchor = neighbor != NULL ? dlsym(RTLD_DEFAULT, neighbor) : NULL;
    Dwfl_Module *module = anchor != NULL ? dwfl_addrmodule(symbolizer->dwfl, (Dwarf_Addr)(uintptr_t)anchor) : NULL;
    if (module != NULL) {
        note_touched(symbolizer, module);
        find_in_module(module, NULL, NULL, 0, &request);
    } else if (neighbor == NULL) {
        dwfl_getmodules(symbolizer->dwfl, find_in_module, &request, 0);
    }
    if (!request.found) return 0;
    *start = request.start;
    *end = request.end;
    return 1;
}

char *stallmon_demangle_swift(const char *name) {
    if (name == NULL) return NULL;
    size_t length = strlen(name);
    // Swift mangled names start with $s, $S, _T0, $e (embedded) or their underscore-prefixed forms.
    if (!(strncmp(name, "$s", 2) == 0 || strncmp(name, "$S", 2) == 0 || strncmp(name, "_$s", 3) == 0 ||
          strncmp(name, "_$S", 3) == 0 || strncmp(name, "_T0", 3) == 0 || strncmp(name, "$e", 2) == 0)) {
        return NULL;
    }
    return swift_demangle(name, length, NULL, NULL, 0);
}

typedef char *(*cxa_demangle_fn)(const char *, char *, size_t *, int *);

char *stallmon_demangle_cxx(const char *name) {
    if (name == NULL || strncmp(name, "_Z", 2) != 0) return NULL;
    // libstdc++ is loaded by Foundation; looked up at run time so that no C++ runtime is linked here.
    static cxa_demangle_fn demangle = NULL;
    static int looked_up = 0;
    if (!looked_up) {
        demangle = (cxa_demangle_fn)dlsym(RTLD_DEFAULT, "__cxa_demangle");
        looked_up = 1;
    }
    if (demangle == NULL) return NULL;
    int status = 0;
    char *result = demangle(name, NULL, NULL, &status);
    return status == 0 ? result : NULL;
}

// MARK: - Trimming

// The private mappings of files (libdwfl maps the images it reads writable,
// ELF_C_READ_MMAP_PRIVATE), read from /proc/self/maps once per trim, by hand: sscanf took about
// 4,700 instructions a line, and a trim that parsed the file for each image it released (or once
// with sscanf) cost the reporting thread over a million instructions (callgrind), more than the
// rest of the trim together.
typedef struct {
    uintptr_t (*ranges)[2];
    size_t count;
} file_mappings;

static const char *parse_hex(const char *cursor, const char *end, unsigned long *value) {
    unsigned long result = 0;
    const char *start = cursor;
    for (; cursor < end; cursor++) {
        char c = *cursor;
        unsigned digit;
        if (c >= '0' && c <= '9') {
            digit = (unsigned)(c - '0');
        } else if (c >= 'a' && c <= 'f') {
            digit = (unsigned)(c - 'a' + 10);
        } else {
            break;
        }
        result = result << 4 | digit;
    }
    *value = result;
    return cursor > start ? cursor : NULL;
}

// Skips one field and the spaces after it.
static const char *skip_field(const char *cursor, const char *end) {
    while (cursor < end && *cursor != ' ' && *cursor != '\n') cursor++;
    while (cursor < end && *cursor == ' ') cursor++;
    return cursor;
}

// One line of /proc/self/maps, "low-high perms offset dev inode [path]": whether it is a readable
// private mapping of a file (its inode is not 0), and its range.
static int parse_mapping(const char *line, const char *end, unsigned long *low, unsigned long *high) {
    const char *cursor = parse_hex(line, end, low);
    if (cursor == NULL || cursor >= end || *cursor != '-') return 0;
    cursor = parse_hex(cursor + 1, end, high);
    if (cursor == NULL || end - cursor < 5 || *cursor != ' ') return 0;
    const char *permissions = cursor + 1;
    if (permissions[0] != 'r' || permissions[3] != 'p') return 0;
    cursor = skip_field(permissions, end);  // permissions
    cursor = skip_field(cursor, end);       // offset
    cursor = skip_field(cursor, end);       // device
    return cursor < end && !(*cursor == '0' && (cursor + 1 == end || cursor[1] == ' ' || cursor[1] == '\n'));
}

static file_mappings read_file_mappings(void) {
    file_mappings mappings = {NULL, 0};
    int descriptor = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (descriptor < 0) return mappings;
    size_t capacity = 0, length = 0, size = 0;
    char *text = NULL;
    for (;;) {
        if (size - length < 4096) {
            size_t grown = size == 0 ? 65536 : size * 2;
            char *larger = realloc(text, grown);
            if (larger == NULL) break;
            text = larger;
            size = grown;
        }
        ssize_t got = read(descriptor, text + length, size - length);
        if (got <= 0) break;
        length += (size_t)got;
    }
    close(descriptor);
    for (const char *line = text, *end = text + length; line != NULL && line < end;) {
        const char *newline = memchr(line, '\n', (size_t)(end - line));
        const char *line_end = newline != NULL ? newline : end;
        unsigned long low, high;
        if (parse_mapping(line, line_end, &low, &high)) {
            if (mappings.count == capacity) {
                size_t grown = capacity == 0 ? 64 : capacity * 2;
                uintptr_t(*ranges)[2] = realloc(mappings.ranges, grown * sizeof *ranges);
                if (ranges == NULL) break;
                mappings.ranges = ranges;
                capacity = grown;
            }
            mappings.ranges[mappings.count][0] = low;
            mappings.ranges[mappings.count][1] = high;
            mappings.count++;
        }
        line = newline != NULL ? newline + 1 : NULL;
    }
    free(text);
    return mappings;
}

// Whether [start, end) lies inside one private mapping of a file: an image libelf mapped. An image
// libdwfl copied into the heap (the vDSO, or one read from process memory) must be left alone.
static int is_private_file_mapping(const file_mappings *mappings, uintptr_t start, uintptr_t end) {
    for (size_t i = 0; i < mappings->count; i++) {
        if (mappings->ranges[i][0] <= start && end <= mappings->ranges[i][1]) return 1;
    }
    return 0;
}

// Drops the pages of [start, end) that still are the file's own (never written): a page written
// to became the process's private copy, which dropping would lose. /proc/self/pagemap tells them
// apart: bit 63 present, bit 61 a file page.
static void release_clean_pages(int pagemap, uintptr_t start, uintptr_t end, uintptr_t page) {
    uint64_t entries[512];
    uintptr_t run = 0;  // start of the current run of clean pages, 0 when none
    for (uintptr_t address = start; address < end;) {
        size_t count = (end - address) / page;
        if (count > 512) count = 512;
        ssize_t got = pread(pagemap, entries, count * sizeof entries[0], (off_t)(address / page * sizeof entries[0]));
        if (got <= 0) break;
        count = (size_t)got / sizeof entries[0];
        for (size_t i = 0; i < count; i++, address += page) {
            int present = (entries[i] >> 63) & 1;
            int file_page = (entries[i] >> 61) & 1;
            int clean = !present || file_page;
            if (clean && run == 0) run = address;
            if (!clean && run != 0) {
                madvise((void *)run, address - run, MADV_DONTNEED);
                run = 0;
            }
        }
    }
    if (run != 0) madvise((void *)run, end - run, MADV_DONTNEED);
}

typedef struct {
    file_mappings mappings;
    int pagemap;
    uintptr_t page;
} trim_context;

static void release_pages(const trim_context *context, Elf *elf) {
    if (elf == NULL) return;
    size_t size = 0;
    char *image = elf_rawfile(elf, &size);
    if (image == NULL || size == 0) return;
    uintptr_t page = context->page;
    uintptr_t start = (uintptr_t)image;
    uintptr_t end = ((uintptr_t)image + size + page - 1) & ~(page - 1);
    if (start % page != 0 || !is_private_file_mapping(&context->mappings, start, end)) return;
    release_clean_pages(context->pagemap, start, end, page);
}

static void trim_module(const trim_context *context, Dwfl_Module *module) {
    Dwarf_Addr bias = 0;
    Elf *main_elf = dwfl_module_getelf(module, &bias);
    release_pages(context, main_elf);
    // The separate debug file that holds the symbol table, when that is where it is.
    GElf_Sym symbol;
    GElf_Addr address;
    Elf *symbol_elf = NULL;
    if (dwfl_module_getsymtab(module) > 1 &&
        dwfl_module_getsym_info(module, 1, &symbol, &address, NULL, &symbol_elf, NULL) != NULL &&
        symbol_elf != NULL && symbol_elf != main_elf) {
        release_pages(context, symbol_elf);
    }
    void **userdata = NULL;
    dwfl_module_info(module, &userdata, NULL, NULL, NULL, NULL, NULL, NULL);
    cu_index *index = userdata != NULL ? *userdata : NULL;
    if (index != NULL && index->dwarf != NULL) release_pages(context, dwarf_getelf(index->dwarf));
}

static trim_context open_trim_context(void) {
    return (trim_context){read_file_mappings(), open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC),
                          (uintptr_t)sysconf(_SC_PAGESIZE)};
}

static void close_trim_context(trim_context *context) {
    if (context->pagemap >= 0) close(context->pagemap);
    free(context->mappings.ranges);
}

// The clean pages of one image, released at once.
static void release_image_pages(Elf *elf) {
    if (elf == NULL) return;
    trim_context context = open_trim_context();
    if (context.pagemap >= 0) release_pages(&context, elf);
    close_trim_context(&context);
}

void stallmon_symbolizer_trim(stallmon_symbolizer *symbolizer) {
    if (symbolizer->touched_count == 0) return;
    trim_context context = open_trim_context();
    if (context.pagemap >= 0) {
        for (size_t i = 0; i < symbolizer->touched_count; i++) trim_module(&context, symbolizer->touched[i]);
    }
    close_trim_context(&context);
    symbolizer->touched_count = 0;
}

#endif  // STALLMON_LINUX
