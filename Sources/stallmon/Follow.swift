import ArgumentParser
import Foundation
import StallCollector
import StallJournal

#if canImport(Glibc)
import Glibc
#endif

/// Prints stall reports as they reach the journal.
struct Follow: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print new stall reports as they reach the journal.",
        discussion: """
            Runs until interrupted. Shows detected, ended, watchdog and suppression entries, each \
            stall with the request it served (endpoint and trace ID) where it served one. Entries \
            that do not match the schema are named on standard error, and make the exit status 65 \
            when it ends; a journal this user may not read exits 69. Control characters from the \
            journal are shown escaped (\\x1b).
            """
    )

    @Option(help: "Only this systemd unit (e.g. foo.service).")
    var unit: String?

    @Option(help: "Read this journal namespace (LogNamespace=) instead of the default one.")
    var namespace: String?

    @Option(name: .customLong("lines"), help: "Show this many earlier entries first.")
    var lines = 0

    @Flag(help: "Print each entry's stall fields as one JSON object a line.")
    var json = false

    func validate() throws {
        guard (0...10_000).contains(lines) else {
            throw ValidationError("--lines must be between 0 and 10000, not \(lines).")
        }
    }

    func run() throws {
        // Runs until SIGINT, SIGTERM or SIGHUP, which end it with its exit status.
        let termination = try TerminationSignals()
        let reader = try JournalSource.open(namespace: namespace, command: "follow")
        let journalDescriptor: Int32
        do {
            journalDescriptor = try reader.fileDescriptor()
            for unitMatches in UnitMatch.terms(unit) {
                for messageID in [
                    MessageID.stallDetected, MessageID.stallEnded, MessageID.watchdogStall,
                    MessageID.reportsSuppressed,
                ] {
                    try reader.addMatch("MESSAGE_ID", messageID)
                }
                for (field, value) in unitMatches { try reader.addMatch(field, value) }
                try reader.addDisjunction()
            }
            // Step back onto the entry before the first one to show (next() then moves past it);
            // with fewer entries than that, show them all.
            try reader.seekTail()
            var steps = 0
            while steps < lines + 1, let entry = try reader.previous() {
                if UnitMatch.accepts(entry, unit: unit) { steps += 1 }
            }
            if steps < lines + 1 { try reader.seekHead() }
        } catch {
            JournalSource.complain("follow", "cannot read the journal: \(error)")
            throw ExitStatus.unavailable
        }
        var malformed = 0
        following: while true {
            do {
                while let entry = try reader.next() {
                    guard UnitMatch.accepts(entry, unit: unit) else { continue }
                    switch Self.render(entry, json: json) {
                    case .success(let text):
                        // Unbuffered: whoever reads a pipe sees each stall as it happens.
                        FileHandle.standardOutput.write(Data((text + "\n").utf8))
                    case .failure(let error):
                        malformed += 1
                        JournalSource.complain("follow", "skipped malformed entry \(entry.cursor): \(error)")
                    }
                }
                let timeout = try reader.pollTimeoutMicroseconds()
                var descriptors = [
                    pollfd(fd: journalDescriptor, events: Int16(POLLIN), revents: 0),
                    pollfd(fd: termination.fileDescriptor, events: Int16(POLLIN), revents: 0),
                ]
                let milliseconds = timeout.map { Int32(clamping: ($0 + 999) / 1000) } ?? -1
                if poll(&descriptors, 2, milliseconds) < 0, errno != EINTR {
                    throw SystemdError(function: "poll", errno: errno)
                }
                if descriptors[1].revents != 0 { break following }
                try reader.process()
            } catch {
                JournalSource.complain("follow", "\(error)")
                throw ExitStatus.unavailable
            }
        }
        if malformed > 0 {
            JournalSource.complain("follow", "\(malformed) malformed entries skipped")
            throw ExitStatus.dataError
        }
    }

    /// One entry as a line of output, or why it does not match the schema.
    static func render(_ entry: JournalEntry, json: Bool) -> Result<String, JournalDecodingError> {
        let fields: [JournalField]
        let fingerprint: String?
        var request: StallRecord.Request?
        do {
            if entry["MESSAGE_ID"] == MessageID.reportsSuppressed {
                fields = try SuppressionRecord(journalFields: entry.fields).fields
                fingerprint = nil
            } else {
                let record = try StallRecord(journalFields: entry.fields)
                fields = record.fields
                fingerprint = record.event == .detected ? nil : record.fingerprint
                request = record.request
            }
        } catch {
            return .failure(error)
        }
        return .success(
            json ? Self.json(entry, fields: fields) : Self.line(entry, fingerprint: fingerprint, request: request))
    }

    /// One line: time, what happened, the unit (as ``StallObservation/unit(of:)`` names it) and
    /// PID, ` (seen from outside)` for a stall stallmond saw from outside (its unit and PID are the
    /// watched process's), the message, the fingerprint and the request the stall served (its
    /// endpoint and trace ID), every part from the journal escaped.
    static func line(_ entry: JournalEntry, fingerprint: String?, request: StallRecord.Request? = nil) -> String {
        let time = Date(timeIntervalSince1970: Double(entry.realtimeMicroseconds) / 1e6)
        let formatter = DateFormatter()
        formatter.dateFormat = "HH:mm:ss.SSS"
        // Named as `report` and the metrics name it: anyone may write any SYSLOG_IDENTIFIER, so
        // one outside a system unit is `(name)`, and `(name) (uid N)` where a user wrote it.
        let unit = StallObservation.unit(
            named: DisplayText.cell(StallObservation.name(of: entry.fields), limit: 64),
            owner: StallObservation.owner(of: entry.fields))
        let pid = DisplayText.cell(StallObservation.subject(of: entry.fields)["_PID"] ?? "?", limit: 12)
        let outside = StallObservation.isSeenFromOutside(entry.fields) ? " (seen from outside)" : ""
        let marker: String
        switch entry["MESSAGE_ID"] {
        case MessageID.stallDetected: marker = "stalling"
        case MessageID.stallEnded: marker = "stalled "
        case MessageID.watchdogStall: marker = "WATCHDOG"
        default: marker = "limited "
        }
        var text =
            "\(formatter.string(from: time)) \(marker) \(unit)[\(pid)]\(outside): \(DisplayText.escaped(entry["MESSAGE"] ?? ""))"
        if let fingerprint { text += " [\(fingerprint)]" }
        return text + RequestText.suffix(request)
    }

    /// The entry's schema fields (as the schema bounds them), where it came from (its unit, PID and
    /// writer's uid, journald's trusted fields) and its cursor. A stall stallmond saw from outside
    /// (`STALL_SOURCE=external`, written by root) also has the watched process's `OBJECT_PID`,
    /// `OBJECT_SYSTEMD_UNIT` and `OBJECT_UID`, which it is attributed by; its `_SYSTEMD_UNIT`,
    /// `_PID` and `_UID` are stallmond's, the writer's.
    static func json(_ entry: JournalEntry, fields: [JournalField]) -> String {
        var object: [String: String] = [:]
        for field in fields { object[field.name] = field.value }
        for name in ["_SYSTEMD_UNIT", "_PID", "_UID"] { object[name] = entry[name] }
        if StallObservation.isSeenFromOutside(entry.fields) {
            for name in ["OBJECT_PID", "OBJECT_SYSTEMD_UNIT", "OBJECT_UID"] { object[name] = entry[name] }
        }
        object["__REALTIME_TIMESTAMP"] = String(entry.realtimeMicroseconds)
        object["__CURSOR"] = entry.cursor
        guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else {
            return "{}"
        }
        return JSONText.escapingControls(String(decoding: data, as: UTF8.self))
    }
}

/// SIGINT, SIGTERM and SIGHUP as a descriptor that becomes readable, so `follow` can end with its
/// own exit status. They are blocked, and a thread waits for them (`sigwait`) and writes to a pipe.
final class TerminationSignals {
    /// Readable once a termination signal arrived.
    let fileDescriptor: Int32

    init() throws {
        var signals = sigset_t()
        sigemptyset(&signals)
        for signal in [SIGINT, SIGTERM, SIGHUP] { sigaddset(&signals, signal) }
        // Blocked here, and so in the thread started below; SIGPIPE (a reader that went away)
        // keeps its default action, even where the parent blocked it.
        pthread_sigmask(SIG_BLOCK, &signals, nil)
        var brokenPipe = sigset_t()
        sigemptyset(&brokenPipe)
        sigaddset(&brokenPipe, SIGPIPE)
        pthread_sigmask(SIG_UNBLOCK, &brokenPipe, nil)
        var ends: [Int32] = [-1, -1]
        guard pipe(&ends) == 0 else { throw SystemdError(function: "pipe", errno: errno) }
        for end in ends { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
        fileDescriptor = ends[0]
        let writeEnd = ends[1]
        let waited = signals
        let waiter = Thread {
            var set = waited
            var received: Int32 = 0
            sigwait(&set, &received)
            var byte = UInt8(truncatingIfNeeded: received)
            _ = write(writeEnd, &byte, 1)
        }
        waiter.name = "stallmon-signals"
        waiter.start()
    }
}
