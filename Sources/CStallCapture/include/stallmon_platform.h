#ifndef STALLMON_PLATFORM_H
#define STALLMON_PLATFORM_H

// Whether CStallCapture builds its Linux implementation: every header of the target includes this
// one first. Elsewhere (and under STALLMON_PRETEND_NON_LINUX, with which CI builds on Linux as on
// other platforms: see Package.swift) the headers declare only what the portable Swift code calls,
// and the sources compile to (nearly) nothing. (CSymbolize, which does not depend on this target,
// keeps a copy of the same three lines in symbolize.h.)
#if defined(__linux__) && !defined(STALLMON_PRETEND_NON_LINUX)
#define STALLMON_LINUX 1
#endif

#endif
