// CStallPlatform is one header, include/stallmon_platform.h, that every C target of the package
// includes to tell whether it builds its Linux implementation. SwiftPM wants a source file in a C
// target: this is it, and it compiles to nothing.
#include "stallmon_platform.h"
