#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// One entry of stallmond's `watch` list: which processes its tick watcher watches from outside.
package enum WatchPattern: Sendable, Hashable, CustomStringConvertible {
    /// Processes running this file (`/proc/PID/exe`), an absolute path.
    case executable(String)
    /// Processes in a systemd unit whose name matches this glob (`fnmatch`: `*`, `?`, `[…]`), as
    /// their cgroup (`/proc/PID/cgroup`) names it: `web.service`, `web-*.service`, `*.scope`.
    case unit(String)

    /// What a `watch` entry must be, for the error that refuses one.
    package static let requirement =
        "must be an absolute executable path (at most 4096 bytes, no control characters) or a systemd unit "
        + "name or glob (at most 256 bytes of letters, digits, :-_.\\@ and the glob characters *?[]), "
        + "e.g. \"/usr/bin/web\", \"web.service\", \"web-*.service\""

    /// Reads one entry; `nil` when it is neither an absolute path nor a unit name or glob.
    package init?(_ text: String) {
        if text.hasPrefix("/") {
            guard text.utf8.count <= 4096, !text.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7f })
            else { return nil }
            self = .executable(text)
            return
        }
        let allowed = Set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:-_.\\@*?[]".utf8)
        guard (1...256).contains(text.utf8.count), text.utf8.allSatisfy(allowed.contains) else { return nil }
        self = .unit(text)
    }

    package var description: String {
        switch self {
        case .executable(let path): path
        case .unit(let glob): glob
        }
    }

    /// Whether a process running `executable` inside the cgroup `cgroup` (its path in the unified
    /// hierarchy, `/system.slice/web.service`) is one this entry names. A unit glob is matched
    /// against each of the cgroup path's components, so that a process in a sub-cgroup of its unit
    /// (`/system.slice/web.service/workers`) is the unit's.
    package func matches(executable: String, cgroup: String) -> Bool {
        switch self {
        case .executable(let path):
            return executable == path
        case .unit(let glob):
            return cgroup.split(separator: "/").contains { fnmatch(glob, String($0), 0) == 0 }
        }
    }
}
