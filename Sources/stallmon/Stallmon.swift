import ArgumentParser

@main
struct Stallmon: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stallmon",
        abstract: "Main run loop stall monitor for Swift services on Linux.",
        discussion: """
            Exit codes: 0 success, 64 usage error, 65 malformed journal data, 69 journal unavailable, \
            70 internal error, 73 output file not writable, 78 invalid configuration.
            """,
        subcommands: [Demo.self, Report.self, Follow.self]
    )
}

/// Documented exit codes (sysexits.h).
enum ExitStatus {
    static let dataError = ExitCode(65)
    static let unavailable = ExitCode(69)
    static let software = ExitCode(70)
    static let configuration = ExitCode(78)
}
