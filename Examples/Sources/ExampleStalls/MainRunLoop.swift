// The main thread of an async main runs RunLoop.main instead of ending in dispatch_main(), for the
// unmonitored service under valgrind: valgrind crashes in dispatch_main() (its sigsuspend thread),
// and stallmon's own drain keeps the monitored service's main thread out of it.
import Foundation

#if canImport(Glibc)
import Glibc
#endif

public enum MainRunLoop {
    /// Sets the runtime's `swift_task_asyncMainDrainQueue_hook` (a data symbol of
    /// libswift_Concurrency.so), which it calls when `main()` first suspends, to run the main run loop
    /// (which drains the main queue) for good. Call it in `main()` before its first `await`, and not
    /// with stallmon, which sets the hook itself. Returns false when the hook is missing or set.
    public static func install() -> Bool {
        // The runtime calls the hook with the Swift calling convention and two arguments; this one
        // never returns and reads neither, so a C function pointer does.
        typealias Hook = @convention(c) (UnsafeRawPointer?, UnsafeRawPointer?) -> Void
        guard let symbol = dlsym(nil, "swift_task_asyncMainDrainQueue_hook") else { return false }
        let slot = symbol.assumingMemoryBound(to: Hook?.self)
        guard slot.pointee == nil else { return false }
        slot.pointee = { _, _ in
            while true { _ = RunLoop.main.run(mode: .default, before: .distantFuture) }
        }
        return true
    }
}
