import Foundation
import StallJournal
import StallmonTestSupport
import Testing

extension Serial {
    /// Reports reach a real journald and read back, field by field, through `journalctl -o json`.
    @Suite
    struct JournalEndToEndTests {
        @Test func stallReportsLandInTheJournalWithEveryField() throws {
            try #require(Journald.host.ensureRunning(), "journald is not running and cannot be started")
            let identifier = "stallmon-test-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            let run = try FixtureRun.run("main-queue-syscall", arguments: ["--journal", "--identifier", identifier])
            #expect(run.exitStatus == 0)
            let printed = try #require(run.ended.first)

            let detected = try Journald.host.entries([
                "SYSLOG_IDENTIFIER=\(identifier)", "MESSAGE_ID=\(MessageID.stallDetected)",
            ])
            let ended = try Journald.host.entries([
                "SYSLOG_IDENTIFIER=\(identifier)", "MESSAGE_ID=\(MessageID.stallEnded)",
            ])
            let lifecycle = try Journald.host.entries(
                ["SYSLOG_IDENTIFIER=\(identifier)", "MESSAGE_ID=\(MessageID.monitorLifecycle)"], atLeast: 2)
            try #require(detected.count == 1)
            try #require(ended.count == 1)
            #expect(lifecycle.map { $0["STALLMON_EVENT"] } == ["started", "stopped"])
            #expect(lifecycle.first?["STALLMON_THRESHOLD_USEC"] == "100000")

            let entry = ended[0]
            for field in [
                "STALL_ID", "STALL_DURATION_USEC", "STALL_THRESHOLD_USEC", "STALL_ACTIVITY", "STALL_RUNLOOP_MODE",
                "STALL_CALLOUT", "STALL_THREAD_TID", "STALL_THREAD_STATE", "STALL_CPU_USEC", "STALL_SAMPLES",
                "STALL_FINGERPRINT", "STALL_BACKTRACE", "PRIORITY", "SYSLOG_IDENTIFIER", "MESSAGE",
            ] {
                #expect(entry[field]?.isEmpty == false, "\(field) missing or empty")
            }
            #expect(entry["STALL_ID"] == detected[0]["STALL_ID"])
            #expect(entry["STALL_CALLOUT"] == "main-queue")
            #expect(entry["STALL_THREAD_STATE"] == "S")
            #expect(entry["STALL_THREAD_TID"] == entry["_PID"])
            #expect(entry["STALL_THRESHOLD_USEC"] == "100000")
            #expect(entry["STALL_RUNLOOP_MODE"] == "kCFRunLoopDefaultMode")
            #expect(entry["PRIORITY"] == "4")
            #expect((entry["STALL_BACKTRACE"]?.utf8.count ?? .max) <= 4096)
            #expect(entry["STALL_BACKTRACE"]?.contains("Stalls.sleepInSyscall(milliseconds:)") == true)
            #expect(entry["MESSAGE"]?.hasPrefix("main run loop stalled 60") == true)
            // What the journal holds is what the monitor reported.
            for (key, value) in printed where key.hasPrefix("STALL_") {
                #expect(entry[key] == value as? String, "\(key)")
            }
            // And the schema reads it back.
            let record = try StallRecord(journalFields: entry)
            #expect(record.event == .ended)
            #expect(record.callout == "main-queue")
            #expect(record.durationMicroseconds == UInt64(entry["STALL_DURATION_USEC"] ?? ""))
        }
    }
}
