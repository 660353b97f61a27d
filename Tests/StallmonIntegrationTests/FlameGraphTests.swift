import Foundation
import FoundationXML
import StallCollector
import StallJournal
import StallmonTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `stallmon report --flamegraph FILE.svg` and `--folded`: the sampled stacks of stalls, weighted
/// by stall time, escaped and bounded however hostile the journal.
struct FlameGraphTests {
    static func record(
        id: Int, milliseconds: UInt64, event: StallRecord.Event = .ended, backtrace: String,
        stacks: String? = nil, stackSamples: Int = 1
    ) throws -> StallRecord {
        var record = StallRecord(
            event: event, message: "m", stallID: String(format: "%032x", id), durationMicroseconds: milliseconds * 1000,
            thresholdMicroseconds: 250_000, activity: "after-waiting", runLoopMode: "kCFRunLoopDefaultMode",
            callout: "timer", loop: "main", threadID: 7, threadState: "R", threadSyscall: "", threadWaitChannel: "",
            cpuMicroseconds: 1, samples: 10, samplesUnanswered: 0, stackSamples: stackSamples,
            fingerprint: "00000000deadbeef", frame: "f", backtrace: backtrace, priority: 4, syslogIdentifier: "svc")
        if let stacks {
            let lines = backtrace.split(separator: "\n", omittingEmptySubsequences: false).count
            record.sampledStacks = try SampledStacks(decoding: stacks, backtraceLineCount: lines)
        }
        return record
    }

    static let backtrace = """
        #0 0x55d4c1a2b3c4 Service.refresh() + 52 at Service.swift:42 [service]
        #1 0x7f0012345678 __CFRUNLOOP_IS_CALLING_OUT_TO_A_TIMER_CALLBACK_FUNCTION__ + 17 [libFoundation.so]
        #2 0x55d4c1a2b000 main + 80 at main.swift:9 [service]
        """

    @Test(arguments: [
        ("0x55d4c1a2b3c4 Service.refresh() + 52 at Service.swift:42 [service]", "Service.refresh() (Service.swift:42)"),
        ("0x1 Array.append(_:) [inlined] at Array.swift:3 [libswiftCore.so]", "Array.append(_:) (Array.swift:3)"),
        ("0x7f00 memcpy + 40 [libc.so.6]", "memcpy"),
        ("0x7f00 [libfoo.so]", "[libfoo.so]"),
        ("0x7f00", "[unknown]"),
        ("(no stack: thread did not answer)", "(no stack: thread did not answer)"),
        ("0x1 look at me() + 3 at A B.swift:x [svc]", "look at me() + 3 at A B.swift:x"),
    ])
    func framesAreLabelledAsPeopleReadThem(line: String, label: String) {
        #expect(FlameGraph.label(line) == label)
    }

    @Test func foldedStacksWeighEachStackByItsShareOfItsStall() throws {
        let graph = FlameGraph([
            // 400 ms: 3 of 4 samples in refresh, 1 in memcpy under refresh.
            try Self.record(
                id: 1, milliseconds: 400, backtrace: Self.backtrace,
                stacks: "=0x7f00 memcpy + 4 [libc.so.6]\n0-2 3\n3,0-2 1"),
            // The same stall's watchdog report, shorter: counted once, at the ended report's duration.
            try Self.record(id: 1, milliseconds: 300, event: .watchdog, backtrace: Self.backtrace, stacks: "0-2 1"),
            // No STALL_STACKS: the backtrace is the stack.
            try Self.record(id: 2, milliseconds: 100, backtrace: Self.backtrace),
        ])
        #expect(graph.stalls == 2)
        #expect(graph.totalMicroseconds == 500_000)
        #expect(
            graph.folded == """
                main (main.swift:9);__CFRUNLOOP_IS_CALLING_OUT_TO_A_TIMER_CALLBACK_FUNCTION__;Service.refresh() (Service.swift:42) 400000
                main (main.swift:9);__CFRUNLOOP_IS_CALLING_OUT_TO_A_TIMER_CALLBACK_FUNCTION__;Service.refresh() (Service.swift:42);memcpy 100000
                """)
    }

    /// The longest duration the schema allows, split between stacks with the largest counts: the
    /// weights are exact (in 128 bits) and nothing traps.
    @Test func largestDurationsAndCountsWeighExactly() throws {
        let record = try Self.record(
            id: 1, milliseconds: FieldLimits.maximumMicroseconds / 1000, backtrace: Self.backtrace,
            stacks: "0-2 4294967295\n1-2 4294967295\n* 4294967295")
        let graph = FlameGraph([record, record])
        #expect(graph.stacks.values.reduce(0, +) == FieldLimits.maximumMicroseconds)
        #expect(graph.stacks.values.sorted() == [10_540_800_000_000, 10_540_800_000_000, 10_540_800_000_000])
    }

    static let hostileFrame = "Evil.<script>alert(1)</script>&amp;\"'; \u{1b}[2J\u{7}\u{0}\u{9b}\u{202e}\u{fffe}"

    /// A hostile frame name is text in the SVG: XML-escaped, control characters shown as escapes,
    /// and the document is well-formed XML.
    @Test func hostileFramesAreEscapedAndTheSVGIsWellFormed() throws {
        let graph = FlameGraph([
            try Self.record(
                id: 1, milliseconds: 900,
                backtrace: "#0 0x1 \(Self.hostileFrame) + 1 at Evil.swift:1 [evil]\n#1 0x2 main [evil]", stacks: "0-1 2"
            )
        ])
        let svg = graph.svg(title: "stallmon report --unit <b>&\u{1b}")
        #expect(!svg.contains("<script"))
        #expect(!svg.contains("<b>"))
        #expect(
            svg.contains(
                "Evil.&lt;script&gt;alert(1)&lt;/script&gt;&amp;amp;&quot;&#39;; \\x1b[2J\\x07\\x00\\u009b\\u202e\\ufffe"
            ))
        #expect(!svg.unicodeScalars.contains { ($0.value < 0x20 && $0 != "\n") || (0x7F...0x9F).contains($0.value) })
        let parser = XMLParser(data: Data(svg.utf8))
        #expect(parser.parse(), "\(String(describing: parser.parserError))")
        // `;` would split the frame in folded text.
        #expect(graph.folded.contains("\\x3b \\x1b[2J"))
        #expect(graph.folded.split(separator: "\n").count == 1)
        #expect(graph.folded.split(separator: ";").count == 2)
    }

    /// 6,000 distinct stacks of 30 frames, 1,000 boxes wide from the sixth frame on: at most
    /// ``FlameGraph/maximumBoxes`` boxes, whole levels from the root.
    @Test func manyStacksAreBoundedToTheWidestBoxes() throws {
        var records: [StallRecord] = []
        for index in 0..<6_000 {
            let lines = (0..<30).map {
                "#\($0) 0x\($0) Deep.frame\($0 == 0 ? index : $0 < 25 ? index % 1000 : 0)_\($0)() at Deep.swift:\($0) [svc]"
            }
            records.append(
                try Self.record(
                    id: index, milliseconds: UInt64(300 + index % 7), backtrace: lines.joined(separator: "\n")))
        }
        let graph = FlameGraph(records)
        #expect(graph.stacks.count == 6_000)
        let svg = graph.svg(title: "many")
        let boxes = svg.components(separatedBy: "<rect ").count - 2  // less the background
        #expect(boxes <= FlameGraph.maximumBoxes)
        #expect(boxes == 1 + 5 + 4 * 1000)  // the root, 5 shared frames, 4 levels of 1,000
        #expect(svg.utf8.count < 4_000_000, "\(svg.utf8.count) bytes")
        #expect(XMLParser(data: Data(svg.utf8)).parse())
    }
}

/// The flame graph against what any local user can write: the schema's worst entries and
/// forged durations.
extension FlameGraphTests {
    /// Entries of the schema's worst (64 stacks of 1,024 frames, each under an outer frame of its
    /// own; 120 of them once took the flame graph to 1.7 GB): it draws 256 frames of a stack and
    /// keeps at most its frame limit (reached by the seventh entry), cut frames counted, and its
    /// drawing stays bounded. (`HostileWriterTests` measures the peak memory of 121 of them.)
    @Test func flameGraphOfTheWorstEntriesStaysBounded() throws {
        var graph = FlameGraph()
        for index in 0..<12 {
            graph.add(try StallRecord(journalFields: Self.worstEntry(index, uid: "65534").fields))
        }
        #expect(graph.stalls == 12)
        #expect(graph.stacks.count <= FlameGraph.maximumNodes)
        #expect(graph.stacks.keys.allSatisfy { $0.count <= FlameGraph.maximumDepth })
        #expect(
            graph.cutFrames > 12 * 64 * (1024 - FlameGraph.maximumDepth), "past the depth, and past the frame limit")
        #expect(graph.summary.contains("cut at \(FlameGraph.maximumNodes) distinct frames"))
        let svg = graph.svg(title: "worst")
        #expect(svg.components(separatedBy: "<rect ").count - 2 <= FlameGraph.maximumBoxes)
        #expect(XMLParser(data: Data(svg.utf8)).parse())
    }

    /// One forged stall of 366 days, and a flood of the worst entries, written outside system
    /// units: the flame graph of the services shows the services, and says what it left out;
    /// `--all-writers` draws them apart, under their writer, the services under `[system units]`.
    @Test func forgedDurationsCannotEraseTheServicesPicture() throws {
        var forged = Self.worstEntry(1000, uid: "65534")
        forged.fields["STALL_DURATION_USEC"] = "\(FieldLimits.maximumMicroseconds)"
        let service = Entries.entry(unit: "real.service", uid: "998", milliseconds: 400)
        var services = ServiceFlameGraph()
        var everything = ServiceFlameGraph(allWriters: true)
        for entry in [forged, service, Self.worstEntry(1, uid: "65534")] {
            let record = try StallRecord(journalFields: entry.fields)
            services.add(record, fields: entry.fields)
            everything.add(record, fields: entry.fields)
        }
        let graph = services.graph
        #expect(graph.stalls == 1)
        #expect(graph.totalMicroseconds == 400_000)
        #expect(graph.folded == "Foo.bar() 400000")
        #expect(graph.summary.contains("2 stalls written outside system units left out (--all-writers draws them)"))
        let all = everything.graph
        #expect(all.stalls == 3)
        #expect(all.stacks.keys.contains { $0.first == "[uid 65534]" })
        #expect(all.stacks[["[system units]", "Foo.bar()"]] == 400_000)
    }

    /// The schema's worst entry (see `CollectorCost.worst` in stallmon-bench), written by `uid`.
    static func worstEntry(_ index: Int, uid: String) -> JournalEntry {
        var entry = Entries.entry(
            unit: nil, uid: uid, fingerprint: Entries.fingerprint(index + 1),
            stallID: String(format: "%032llx", UInt64(index + 1)), cursor: "w\(index)")
        entry.fields["STALL_BACKTRACE"] =
            "#0 Service.refresh() at Service.swift:1" + String(repeating: "\n", count: 1023)
        var lines = (0..<64).map { "=Outer.frame\($0)_\(index)() at Outer.swift:\($0)" }
        lines += (0..<64).map { "0-1022,\(1024 + $0) 1" }
        entry.fields["STALL_STACKS"] = lines.joined(separator: "\n")
        return entry
    }
}

extension Serial {
    /// The flame graph of real stalls of the fixture service, read back from a real journald,
    /// opened in headless Chromium.
    @Suite
    struct FlameGraphEndToEndTests {
        @Test func flameGraphOfARealStallShowsTheStallingFunction() throws {
            try Self.drawRealStall { _, _ in }
        }

        @Test(.requires(.chromium, .python)) func flameGraphOfARealStallShowsTheStallingFunctionInChromium() throws {
            try Self.drawRealStall { path, directory in try Self.checkInChromium(svg: path, directory: directory) }
        }

        /// A real stall of the fixture, its entry copied into a journal of its own beside a hostile
        /// one, folded and drawn by `stallmon report`; `body` gets the SVG's path and its directory.
        static func drawRealStall(_ body: (String, String) throws -> Void) throws {
            try #require(Journald.host.ensureRunning())
            let identifier = "stallmon-flame-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            let run = try FixtureRun.run("timer-cpu", arguments: ["--journal", "--identifier", identifier])
            #expect(run.exitStatus == 0, "\(run.standardError)")
            let entries = try Journald.host.entries([
                "SYSLOG_IDENTIFIER=\(identifier)", "MESSAGE_ID=\(MessageID.stallEnded)",
            ])
            let entry = try #require(entries.first)
            let stacksField = try #require(entry["STALL_STACKS"], "no STALL_STACKS in \(entry)")
            #expect(stacksField.utf8.count <= 4096)

            // Into a journal of its own, with a hostile entry next to it.
            let journal = Journald.namespaced()
            defer { journal.remove() }
            try #require(journal.ensureRunning())
            try journal.send(
                entry.filter { !$0.key.hasPrefix("_") }.sorted { $0.key < $1.key }.map { ($0.key, $0.value) })
            try journal.send(
                Entries.stallFields(
                    identifier: "evil", fingerprint: "00000000deadbeef", frame: FlameGraphTests.hostileFrame,
                    overrides: ["STALL_BACKTRACE": "#0 0x1 \(FlameGraphTests.hostileFrame) [evil]"]))
            try #require(journal.waitForEntries(2, messageIDs: [MessageID.stallEnded]))

            let folded = try Executable.stallmon.run(["report", "--namespace", journal.name, "--folded"])
            #expect(folded.status == 0, "\(folded.errors)")
            let lines = folded.output.split(separator: "\n")
            #expect(lines.contains { $0.contains("Stalls.burnCPU(milliseconds:) (Stalls.swift:") }, "\(folded.output)")
            let total = lines.compactMap { $0.split(separator: " ").last.flatMap { UInt64($0) } }.reduce(0, +)
            // Every microsecond of both stalls (the hostile one lasted 400 ms), and no more.
            let duration = try #require(UInt64(entry["STALL_DURATION_USEC"] ?? ""))
            #expect(total == duration + 400_000)

            let directory = NSTemporaryDirectory() + "stallmon-flame-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let path = directory + "/stalls.svg"
            let drawn = try Executable.stallmon.run(["report", "--namespace", journal.name, "--flamegraph", path])
            #expect(drawn.status == 0, "\(drawn.errors)")
            #expect(drawn.output.hasPrefix("flame graph of 2 stalls"), "\(drawn.output)")
            let svg = try String(contentsOfFile: path, encoding: .utf8)
            #expect(svg.contains(">Stalls.burnCPU(milliseconds:) (Stalls.swift:"))
            #expect(!svg.contains("<script"))

            let unwritable = try Executable.stallmon.run(
                ["report", "--namespace", journal.name, "--flamegraph", directory + "/missing/stalls.svg"])
            #expect(unwritable.status == 73)
            #expect(unwritable.errors.contains("cannot write the flame graph"))

            try body(path, directory)
        }

        /// Chromium parses the SVG as XML (a malformed one shows a parser error instead), renders
        /// the stalling function's frame as text, and draws a picture that is not blank.
        static func checkInChromium(svg path: String, directory: String) throws {
            let chromium = try ExternalTool.required(.chromium)
            let common = [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--user-data-dir=\(directory)/chromium-profile", "--window-size=1200,700", "--hide-scrollbars",
            ]
            let dom = try ExternalTool.run(chromium, common + ["--dump-dom", "file://\(path)"], directory: directory)
            #expect(dom.status == 0, "\(dom.output.suffix(2000))")
            #expect(!dom.output.contains("parsererror"), "\(dom.output.prefix(2000))")
            #expect(dom.output.contains(">Stalls.burnCPU(milliseconds:) (Stalls.swift:"))
            #expect(!dom.output.contains("<script"))

            let screenshot = directory + "/stalls.png"
            let shot = try ExternalTool.run(
                chromium, common + ["--screenshot=\(screenshot)", "file://\(path)"], directory: directory)
            #expect(shot.status == 0, "\(shot.output.suffix(2000))")
            let png = try Data(contentsOf: URL(fileURLWithPath: screenshot))
            #expect(png.starts(with: [0x89, 0x50, 0x4E, 0x47]))
            if let keep = ProcessInfo.processInfo.environment["STALLMON_FLAMEGRAPH_SCREENSHOT"] {
                try? FileManager.default.removeItem(atPath: keep)
                try FileManager.default.copyItem(atPath: screenshot, toPath: keep)
            }
            // The colours of the picture: a blank page has one; the flame graph has the warm boxes
            // of the program's frames and the cool ones of the libraries.
            let python = try ExternalTool.required(.python)
            let census = try ExternalTool.run(python, ["-c", Self.pngCensus, screenshot])
            let figures = census.output.split(separator: " ").compactMap {
                Int($0.trimmingCharacters(in: .whitespacesAndNewlines))
            }
            #expect(figures.count == 3, "\(census.output)")
            if figures.count == 3 {
                let (colours, warm, cool) = (figures[0], figures[1], figures[2])
                #expect(
                    colours > 20 && warm > 2_000 && cool > 2_000, "colours \(colours), warm \(warm), cool \(cool) px")
            }
        }

        /// Decodes an 8-bit RGB(A) PNG and prints its number of distinct colours, and the pixels of
        /// warm (the program's frames) and cool (library frames) boxes.
        static let pngCensus = #"""
            import struct, sys, zlib
            data = open(sys.argv[1], "rb").read()
            pos, chunks = 8, {}
            while pos < len(data):
                length, kind = struct.unpack(">I4s", data[pos:pos + 8])
                chunks.setdefault(kind, b"")
                chunks[kind] += data[pos + 8:pos + 8 + length]
                pos += 12 + length
            width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
            channels = {2: 3, 6: 4}[colour]
            raw, stride, rows, previous = zlib.decompress(chunks[b"IDAT"]), width * channels, [], bytearray(width * channels)
            for y in range(height):
                kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
                for i in range(stride):
                    a = line[i - channels] if i >= channels else 0
                    b, c = previous[i], previous[i - channels] if i >= channels else 0
                    if kind == 1: line[i] = (line[i] + a) & 255
                    elif kind == 2: line[i] = (line[i] + b) & 255
                    elif kind == 3: line[i] = (line[i] + (a + b) // 2) & 255
                    elif kind == 4:
                        p = a + b - c
                        pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                        line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
                rows.append(line)
                previous = line
            colours, warm, cool = set(), 0, 0
            for line in rows:
                for x in range(0, stride, channels):
                    r, g, b = line[x], line[x + 1], line[x + 2]
                    colours.add((r, g, b))
                    if r >= 200 and b <= 80: warm += 1
                    if b >= 195 and r <= 175: cool += 1
            print(len(colours), warm, cool)
            """#
    }
}
