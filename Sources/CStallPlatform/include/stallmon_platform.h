#ifndef STALLMON_PLATFORM_H
#define STALLMON_PLATFORM_H

// Whether the C targets build their Linux implementation: CStallCapture's, CSymbolize's and
// CStallWatch's headers include this one first. Elsewhere (and under STALLMON_PRETEND_NON_LINUX,
// with which CI builds on Linux as on other platforms: see Package.swift) the headers declare only
// what the portable Swift code calls, and the sources compile to (nearly) nothing.
#if defined(__linux__) && !defined(STALLMON_PRETEND_NON_LINUX)
#define STALLMON_LINUX 1
#endif

#endif
