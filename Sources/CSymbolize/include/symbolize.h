#ifndef STALLMON_SYMBOLIZE_H
#define STALLMON_SYMBOLIZE_H

// Symbolication of this process's code addresses through elfutils' libdwfl: module, symbol,
// inline chain and source location. Not thread-safe: one owner serializes all calls.

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

// STALLMON_LINUX: the Linux implementation. Elsewhere this header declares only what the portable
// Swift code calls, and the sources compile to (nearly) nothing.
#include "stallmon_platform.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(STALLMON_LINUX)

typedef struct stallmon_symbolizer stallmon_symbolizer;

/// One source-level frame. Strings are owned by the symbolizer and stay valid until the next
/// stallmon_symbolizer_refresh or stallmon_symbolizer_destroy.
typedef struct {
    const char *module_path;    ///< NULL when the address is in no known module
    uintptr_t module_base;      ///< load address of the module
    const char *symbol;         ///< raw (mangled) name, NULL when unknown
    uintptr_t symbol_offset;    ///< address minus the symbol's start (outermost frame only)
    const char *file;           ///< source file, NULL without debug info
    int line;
    int column;
    int inlined;                ///< 1 when this frame was inlined into the next one
} stallmon_symbol;

/// Reports the modules currently mapped into process `pid`. Returns NULL on failure.
stallmon_symbolizer *stallmon_symbolizer_create(pid_t pid);
void stallmon_symbolizer_destroy(stallmon_symbolizer *symbolizer);
/// Re-reads the process's mappings (after dlopen). Invalidates strings handed out before.
int stallmon_symbolizer_refresh(stallmon_symbolizer *symbolizer);

/// Drops the pages of the modules' files that lookups read in (symbol tables, DWARF), which the
/// symbolizer maps privately and never writes: they leave the process's resident set and come back
/// from the page cache on the next lookup. Strings handed out stay valid.
void stallmon_symbolizer_trim(stallmon_symbolizer *symbolizer);

/// Resolves `address` into up to `capacity` frames, innermost (inlined) first.
/// `is_return_address` makes the lookup use address - 1, the call instruction.
/// Returns the number of frames written (0 when the address is in no known module).
int stallmon_symbolize(stallmon_symbolizer *symbolizer, uintptr_t address, int is_return_address,
                       stallmon_symbol *out, int capacity);

/// Finds a function symbol by exact name in the module that defines the exported symbol
/// `neighbor` (found with dlsym), or in any module when `neighbor` is NULL (which loads the symbol
/// table of every module). Returns 1 and its address range when found.
int stallmon_symbolizer_find_function(stallmon_symbolizer *symbolizer, const char *name, const char *neighbor,
                                      uintptr_t *start, uintptr_t *end);

/// Demangles a Swift symbol with the runtime's demangler. Returns a malloc'd string, or NULL when
/// `name` is not a Swift symbol. The corresponding runtime function is `swift_demangle`.
char *stallmon_demangle_swift(const char *name);
/// Demangles an Itanium C++ symbol. Returns a malloc'd string or NULL.
char *stallmon_demangle_cxx(const char *name);

#endif  // STALLMON_LINUX

#ifdef __cplusplus
}
#endif

#endif
