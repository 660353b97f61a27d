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
                reason:
                    "is \(kind); refusing to use it (remove it to start counting again from the newest entries, cold_start_entries)"
            )
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
                reason:
                    "is damaged: \(damage) (remove it to start counting again from the newest entries, cold_start_entries)"
            )
        }
        return state
    }

    package func save(_ state: CollectorState) throws {
        try save(state, encoder: Encoder(), changed: nil)
    }

    /// Saves `state`, encoding again only the units in `changed` (`nil`: every unit) and those
    /// `encoder` has not encoded yet.
    package func save(_ state: CollectorState, encoder: Encoder, changed: Set<String>?) throws {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try AtomicFile.write(encoder.encode(state, changed: changed), to: path, mode: 0o600)
    }

    /// Encodes successive states as JSON, encoding again only the units that changed since the
    /// last call: a new stall costs the same whatever the number of series. The rest of the
    /// state (positions, recent stalls, hosts) is encoded each time.
    ///
    /// - Important: Not thread-safe: one caller at a time (the collector's save queue).
    package final class Encoder {
        /// Each unit's key and value, as they stand in the document's `units` object.
        private var units: [String: Data] = [:]
        private let json: JSONEncoder

        package init() {
            json = JSONEncoder()
            json.outputFormatting = [.sortedKeys]
        }

        package func encode(_ state: CollectorState, changed: Set<String>?) throws -> Data {
            if changed == nil { units = [:] }
            for unit in changed ?? [] { units[unit] = nil }
            if units.count > state.units.count { units = units.filter { state.units[$0.key] != nil } }
            var rest = state
            rest.units = [:]
            let document = try json.encode(rest)
            let marker = Data(#""units":{}"#.utf8)
            guard let range = document.range(of: marker) else { return try json.encode(state) }
            var result = Data(document[..<range.lowerBound])
            result.append(contentsOf: #""units":{"#.utf8)
            for (index, unit) in state.units.keys.sorted().enumerated() {
                if index > 0 { result.append(UInt8(ascii: ",")) }
                if let member = units[unit] {
                    result.append(member)
                } else {
                    var member = try json.encode(unit)
                    member.append(UInt8(ascii: ":"))
                    member.append(try json.encode(state.units[unit]!))
                    units[unit] = member
                    result.append(member)
                }
            }
            result.append(UInt8(ascii: "}"))
            result.append(document[range.upperBound...])
            return result
        }
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
