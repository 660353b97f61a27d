import Logging

extension Logger {
    /// A logger that drops everything, for tests about something else.
    package static let quiet = Logger(label: "quiet") { _ in SwiftLogNoOpLogHandler() }
}
