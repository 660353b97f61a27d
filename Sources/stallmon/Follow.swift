import ArgumentParser
import Foundation
import StallJournal

#if canImport(Glibc)
    import Glibc
#endif

/// Prints stall reports as they reach the journal.
struct Follow: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print new stall reports as they reach the journal.",
        discussion: "Runs until interrupted. Shows detected, ended, watchdog and suppression entries."
    )

    @Option(help: "Only this systemd unit (e.g. foo.service).")
    var unit: String?

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
        // Runs until interrupted: a parent that spawned us with termination signals blocked
        // (a libdispatch worker does) would otherwise never be able to stop us.
        var termination = sigset_t()
        sigemptyset(&termination)
        for signal in [SIGINT, SIGTERM, SIGHUP, SIGPIPE] { sigaddset(&termination, signal) }
        pthread_sigmask(SIG_UNBLOCK, &termination, nil)
        let reader: JournalReader
        do {
            reader = try JournalReader()
            for messageID in [
                MessageID.stallDetected, MessageID.stallEnded, MessageID.watchdogStall, MessageID.reportsSuppressed,
            ] {
                try reader.addMatch("MESSAGE_ID", messageID)
            }
            if let unit { try reader.addMatch("_SYSTEMD_UNIT", unit) }
            // Step back onto the entry before the first one to show (next() then moves past it);
            // with fewer entries than that, show them all.
            try reader.seekTail()
            var steps = 0
            while steps < lines + 1, try reader.previous() != nil { steps += 1 }
            if steps < lines + 1 { try reader.seekHead() }
        } catch {
            FileHandle.standardError.write(Data("stallmon follow: cannot read the journal: \(error)\n".utf8))
            throw ExitStatus.unavailable
        }
        while true {
            do {
                while let entry = try reader.next() {
                    // Unbuffered: whoever reads a pipe sees each stall as it happens.
                    FileHandle.standardOutput.write(Data(((json ? Self.json(entry) : Self.line(entry)) + "\n").utf8))
                }
                try reader.wait(timeoutMicroseconds: 1_000_000)
            } catch {
                FileHandle.standardError.write(Data("stallmon follow: \(error)\n".utf8))
                throw ExitStatus.unavailable
            }
        }
    }

    static func line(_ entry: JournalEntry) -> String {
        let time = Date(timeIntervalSince1970: Double(entry.realtimeMicroseconds) / 1e6)
        let formatter = DateFormatter()
        formatter.dateFormat = "HH:mm:ss.SSS"
        let unit = entry["_SYSTEMD_UNIT"] ?? entry["SYSLOG_IDENTIFIER"] ?? "?"
        let marker: String
        switch entry["MESSAGE_ID"] {
        case MessageID.stallDetected: marker = "stalling"
        case MessageID.stallEnded: marker = "stalled "
        case MessageID.watchdogStall: marker = "WATCHDOG"
        default: marker = "limited "
        }
        var text =
            "\(formatter.string(from: time)) \(marker) \(unit)[\(entry["_PID"] ?? "?")]: \(entry["MESSAGE"] ?? "")"
        if entry["MESSAGE_ID"] == MessageID.stallEnded || entry["MESSAGE_ID"] == MessageID.watchdogStall,
            let fingerprint = entry[StallRecord.Field.fingerprint]
        {
            text += " [\(fingerprint)]"
        }
        return text
    }

    static func json(_ entry: JournalEntry) -> String {
        var object = entry.fields.filter {
            $0.key.hasPrefix("STALL")
                || ["MESSAGE", "MESSAGE_ID", "PRIORITY", "SYSLOG_IDENTIFIER", "_SYSTEMD_UNIT", "_PID"].contains($0.key)
        }
        object["__REALTIME_TIMESTAMP"] = String(entry.realtimeMicroseconds)
        object["__CURSOR"] = entry.cursor
        guard let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) else {
            return "{}"
        }
        return String(decoding: data, as: UTF8.self)
    }
}
