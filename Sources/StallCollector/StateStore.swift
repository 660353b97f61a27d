import Foundation

/// Keeps ``CollectorState`` in `state.json` of the state directory, replaced atomically.
public struct StateStore: Sendable {
    public let directory: String
    public var path: String { directory + "/state.json" }

    public init(directory: String) {
        self.directory = directory
    }

    /// The saved state, or a fresh one when there is none yet.
    /// - Throws: when the file exists but cannot be read or decoded (it is never silently replaced).
    public func load() throws -> CollectorState {
        guard FileManager.default.fileExists(atPath: path) else { return CollectorState() }
        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        do {
            return try JSONDecoder().decode(CollectorState.self, from: data)
        } catch {
            throw StateError(path: path, reason: "not a stallmond state file: \(error)")
        }
    }

    public func save(_ state: CollectorState) throws {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        try AtomicFile.write(encoder.encode(state), to: path, mode: 0o600)
    }

    public struct StateError: Error, CustomStringConvertible {
        public var path: String
        public var reason: String
        public var description: String { "\(path): \(reason)" }
    }
}
