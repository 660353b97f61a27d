import Foundation
import StallmonTestSupport
import Testing

extension Serial {
    /// A second after each report, the symbolicator releases the pages of the image files it read;
    /// the next report reads them again and loses nothing.
    @Suite
    struct SymbolicationMemoryTests {
        @Test func reportAfterTheSymbolicatorReleasedItsPagesHasFileAndLine() throws {
            let run = try FixtureRun.run(
                "stream", arguments: ["--period-ms", "1700", "--stall-ms", "200", "--seconds", "3.8"])
            #expect(run.exitStatus == 0)
            try #require(run.ended.count == 2, "\(run.ended.count) stalls")
            for ended in run.ended {
                let frame = ended.frames.first { $0["function"] as? String == "Stalls.sleepInSyscall(milliseconds:)" }
                let found = try #require(frame, "\(ended.frames.map { $0["function"] ?? "" })")
                #expect((found["file"] as? String)?.hasSuffix("Stalls.swift") == true)
                #expect((found["line"] as? Int ?? 0) > 0)
            }
            #expect(run.ended[0].string("STALL_BACKTRACE") == run.ended[1].string("STALL_BACKTRACE"))
        }
    }
}
