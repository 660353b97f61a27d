#define _GNU_SOURCE
#include "symbolize.h"

#include <dlfcn.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <stdlib.h>
#include <string.h>

// Exported by libswiftCore; declared here because no public header carries it.
extern char *swift_demangle(const char *mangled_name, size_t mangled_name_length, char *output_buffer,
                            size_t *output_buffer_size, uint32_t flags);

struct stallmon_symbolizer {
    Dwfl *dwfl;
    pid_t pid;
};

static char *debuginfo_path = NULL;

static const Dwfl_Callbacks callbacks = {
    .find_elf = dwfl_linux_proc_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .debuginfo_path = &debuginfo_path,
};

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
    if (symbolizer->dwfl != NULL) dwfl_end(symbolizer->dwfl);
    free(symbolizer);
}

int stallmon_symbolizer_refresh(stallmon_symbolizer *symbolizer) { return report(symbolizer); }

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

    Dwarf_Addr start = 0;
    const char *module_path = NULL;
    const char *module_name = dwfl_module_info(module, NULL, &start, NULL, NULL, NULL, &module_path, NULL);
    if (module_path == NULL) module_path = module_name;

    GElf_Off offset = 0;
    GElf_Sym elf_symbol;
    const char *symbol = dwfl_module_addrinfo(module, lookup, &offset, &elf_symbol, NULL, NULL, NULL);

    const char *file = NULL;
    int line = 0, column = 0;
    Dwfl_Line *source = dwfl_module_getsrc(module, lookup);
    if (source != NULL) file = dwfl_lineinfo(source, NULL, &line, &column, NULL, NULL);

    int count = 0;
    Dwarf_Addr bias = 0;
    Dwarf_Die *cudie = dwfl_module_addrdie(module, lookup, &bias);
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

int stallmon_symbolizer_find_function(stallmon_symbolizer *symbolizer, const char *name, uintptr_t *start,
                                      uintptr_t *end) {
    find_request request = {.name = name};
    dwfl_getmodules(symbolizer->dwfl, find_in_module, &request, 0);
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
