import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Keeps ``CollectorState`` in `state.json` of the state directory, replaced atomically.
package struct StateStore: Sendable {
    package let directory: String
    package var path: String { directory + "/state.json" }

    package init(directory: String) {
        self.directory = directory
    }

    /// The saved state, or a fresh one when there is none yet.
    /// - Throws: when the file exists but cannot be read or decoded (it is never silently replaced).
    package func load() throws -> CollectorState {
        var status = stat()
        if lstat(path, &status) != 0 {
            guard errno == ENOENT else {
                throw StateError(path: path, reason: "cannot be examined: \(String(cString: strerror(errno)))")
            }
            return CollectorState()
        }
        // A link (even a dangling one) is refused, never followed: starting afresh from the
        // journal's head would count every stall again, and following it could read another file.
        guard status.st_mode & S_IFMT == S_IFREG else {
            let kind = status.st_mode & S_IFMT == S_IFLNK ? "a symbolic link" : "not a regular file"
            throw StateError(
                path: path,
                reason: "is \(kind); refusing to use it (remove it to start counting from the journal's head again)")
        }
        let data = try Self.read(path)
        let state: CollectorState
        do {
            state = try JSONDecoder().decode(CollectorState.self, from: data)
        } catch {
            throw StateError(path: path, reason: "not a stallmond state file: \(error)")
        }
        // Impossible counts would be exported as they are, and counted on from: refused, and why.
        if let damage = state.damage {
            throw StateError(
                path: path,
                reason: "is damaged: \(damage) (remove it to start counting from the journal's head again)")
        }
        return state
    }

    package func save(_ state: CollectorState) throws {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        try AtomicFile.write(encoder.encode(state), to: path, mode: 0o600)
    }

    /// The file's bytes, opened without following a link that appeared since it was examined.
    private static func read(_ path: String) throws(StateError) -> Data {
        let descriptor = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
        guard descriptor >= 0 else {
            throw StateError(path: path, reason: "cannot be opened: \(String(cString: strerror(errno)))")
        }
        defer { close(descriptor) }
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let count = buffer.withUnsafeMutableBytes { Glibc.read(descriptor, $0.baseAddress, $0.count) }
            if count < 0, errno == EINTR { continue }
            guard count >= 0 else {
                throw StateError(path: path, reason: "cannot be read: \(String(cString: strerror(errno)))")
            }
            if count == 0 { return data }
            data.append(contentsOf: buffer[..<count])
        }
    }

    package struct StateError: Error, CustomStringConvertible {
        package var path: String
        package var reason: String
        package var description: String { "\(path): \(reason)" }
    }
}
