import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Something a test needs from outside this package: an example service built by
/// `swift build --package-path Examples`, a program README's first command does not install, or
/// root. A test that needs one which is missing is skipped, naming it, so that the summary counts
/// it as skipped rather than passed; where `REQUIRE_TEST_TOOLS=1` (CI) it runs anyway, and fails
/// at its own `#require` of the missing part.
package enum TestRequirement: Sendable, CustomStringConvertible {
    /// An example service's binary (`Examples/.build/debug/<service>`).
    case example(FrameworkService.Kind)
    /// A program found on `PATH` under one of `names`, and the Debian package that installs it.
    case tool(_ names: [String], package: String)
    /// A program at a fixed path, and the Debian package that installs it.
    case executable(_ path: String, package: String)
    /// Root and util-linux's `unshare`: a service run as in a container (``FrameworkService/canRunInContainer``).
    case container
    /// Root, systemd, `unshare` and `nsenter`: systemd booted in a namespace (``SystemdNamespace/isSupported``).
    case systemd
    /// Root and a kernel with BPF and the system call tracepoints (tracefs at `/sys/kernel/tracing`,
    /// mounted by ``mountTracefs()`` when it is not yet): stallmond's tick watcher.
    case bpf

    package static let promtool = Self.tool(["promtool"], package: "prometheus")
    package static let chromium = Self.tool(["chromium", "chromium-browser"], package: "chromium")
    package static let nodeExporter = Self.tool(
        ["prometheus-node-exporter", "node_exporter"], package: "prometheus-node-exporter")
    package static let python = Self.tool(["python3"], package: "python3")
    package static let journalRemote = Self.executable(
        "/lib/systemd/systemd-journal-remote", package: "systemd-journal-remote")

    /// Where CI runs, every requirement must be met: a test that needs a missing one fails.
    package static var required: Bool { ProcessInfo.processInfo.environment["REQUIRE_TEST_TOOLS"] == "1" }

    /// Whether it is met here.
    package var isMet: Bool {
        switch self {
        case .example(let kind): FrameworkService.binary(kind) != nil
        case .tool(let names, _): names.contains { ExternalTool.find($0) != nil }
        case .executable(let path, _): FileManager.default.isExecutableFile(atPath: path)
        case .container: FrameworkService.canRunInContainer
        case .systemd: SystemdNamespace.isSupported
        case .bpf:
            geteuid() == 0 && FileManager.default.fileExists(atPath: "/sys/kernel/tracing")
                && FileManager.default.fileExists(atPath: "/sys/fs/bpf")
        }
    }

    /// What is needed, and how to get it.
    package var description: String {
        switch self {
        case .example(let kind): "Examples/.build/debug/\(kind) (swift build --package-path Examples)"
        case .tool(let names, let package): "\(names[0]) (apt-get install \(package))"
        case .executable(let path, let package): "\(path) (apt-get install \(package))"
        case .container: "root and util-linux's unshare (a service run as in a container)"
        case .systemd: "root, systemd, unshare and nsenter (systemd booted in a namespace)"
        case .bpf: "root and a kernel with BPF and system call tracepoints (stallmond's tick watcher)"
        }
    }

    /// Mounts tracefs at `/sys/kernel/tracing` unless it is there, as an operator would for
    /// stallmond's tick watcher (libbpf finds the tracepoints there); true when it is mounted.
    package static func mountTracefs() -> Bool {
        let events = "/sys/kernel/tracing/events/syscalls"
        if FileManager.default.fileExists(atPath: events) { return true }
        _ = mount("nodev", "/sys/kernel/tracing", "tracefs", 0, nil)
        return FileManager.default.fileExists(atPath: events)
    }
}

extension Trait where Self == ConditionTrait {
    /// Runs the test only where every one of `requirements` is met (or `REQUIRE_TEST_TOOLS=1`);
    /// otherwise it is skipped, and the skip names what is missing.
    package static func requires(_ requirements: TestRequirement...) -> Self {
        let missing = requirements.filter { !$0.isMet }
        let comment = Comment(rawValue: "needs " + missing.map(\.description).joined(separator: ", "))
        return .enabled(if: missing.isEmpty || TestRequirement.required, comment)
    }
}

extension FrameworkService {
    /// The example's binary; an issue (and a thrown error) when it has not been built, which a
    /// test reaches only where `REQUIRE_TEST_TOOLS=1` (``Testing/Trait/requires(_:)`` skips it
    /// elsewhere).
    package static func requiredBinary(_ kind: Kind, sourceLocation: SourceLocation = #_sourceLocation) throws -> URL {
        try #require(
            binary(kind), "\(TestRequirement.example(kind)) is missing", sourceLocation: sourceLocation)
    }
}

extension ExternalTool {
    /// The tool's path; an issue (and a thrown error) when it is not installed.
    package static func required(_ requirement: TestRequirement, sourceLocation: SourceLocation = #_sourceLocation)
        throws -> String
    {
        let path: String? =
            switch requirement {
            case .tool(let names, _): names.lazy.compactMap { find($0) }.first
            case .executable(let path, _): FileManager.default.isExecutableFile(atPath: path) ? path : nil
            default: nil
            }
        return try #require(path, "\(requirement) is missing", sourceLocation: sourceLocation)
    }
}
