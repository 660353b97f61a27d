import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Polls `condition` every 10 ms until it holds or `timeout` seconds pass; whether it held.
package func waitUntil(timeout: Double = 10, _ condition: () -> Bool) -> Bool {
    let deadline = Date() + timeout
    while Date() < deadline {
        if condition() { return true }
        usleep(10_000)
    }
    return condition()
}
