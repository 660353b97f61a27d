extension StallMonitoring.Configuration {
    /// Where the default sinks send reports (the `sink` key, `STALLMON_SINK`): `nil` (`"auto"`, the
    /// default) chooses by what the process has, the others decide.
    ///
    /// | `sink` | reports go to |
    /// |---|---|
    /// | `"auto"` | the journal while journald takes entries; each entry it does not take (no socket, as in a container; journald down) goes to standard error: one JSON object a line, or the readable text when standard error is a terminal |
    /// | `"journal"` | the journal only; an entry journald does not take is lost (and counted) |
    /// | `"json"` | standard error, one JSON object a line, whatever it is |
    /// | `"text"` | standard error, the readable text |
    /// | `"logger"` | the monitor's swift-log `Logger`, every field as metadata (`LoggerSink`) |
    ///
    /// Sinks given to the monitor's initializer replace the default ones, and this with them.
    /// Later versions may add destinations: compare with `==` rather than `switch` over them.
    public struct ReportDestination: Sendable, Hashable, CustomStringConvertible {
        private enum Value: String, Sendable, Hashable, CaseIterable {
            case journal, json, text, logger
        }

        private let value: Value

        private init(_ value: Value) {
            self.value = value
        }

        /// The journal alone.
        public static let journal = Self(.journal)
        /// One JSON object a line on standard error.
        public static let json = Self(.json)
        /// The readable text on standard error.
        public static let text = Self(.text)
        /// The monitor's `Logger`.
        public static let logger = Self(.logger)

        /// The destination named `name` as the configuration writes it (`"json"`); `nil` for
        /// another name (`"auto"` is no destination but the absence of one).
        public init?(named name: String) {
            guard let value = Value(rawValue: name) else { return nil }
            self.value = value
        }

        /// Every name the configuration accepts, `auto` included.
        static let names = ["auto"] + Value.allCases.map(\.rawValue)

        /// The name as the configuration writes it: `journal`, `json`, `text` or `logger`.
        public var description: String { value.rawValue }
    }
}
