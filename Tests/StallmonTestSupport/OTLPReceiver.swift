import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// An OTLP/HTTP receiver on loopback: python3's HTTP server, which keeps each JSON body POSTed to
/// `/v1/traces` or `/v1/logs` and answers 200. Stopped (by pid) when the test is done with it.
package final class OTLPReceiver: @unchecked Sendable {
    private static let script = """
        import http.server, sys
        out = open(sys.argv[1], 'ab')
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get('Content-Length', 0)))
                if self.path in ('/v1/traces', '/v1/logs'):
                    out.write(body.replace(b'\\n', b' ') + b'\\n'); out.flush()
                self.send_response(200); self.send_header('Content-Type', 'application/json'); self.end_headers()
                self.wfile.write(b'{}')
            def log_message(self, *arguments): pass
        server = http.server.HTTPServer(('127.0.0.1', 0), Handler)
        print(server.server_address[1], flush=True)
        server.serve_forever()
        """

    package let port: Int
    private let process: Process
    private let file: URL

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    package init() throws {
        file = FileManager.default.temporaryDirectory.appendingPathComponent("stallmon-otlp-\(UUID().uuidString)")
        process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", "-c", Self.script, file.path]
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let line = String(decoding: output.fileHandleForReading.availableData, as: UTF8.self)
        guard let port = Int(line.trimmingCharacters(in: .whitespacesAndNewlines)) else {
            process.terminate()
            throw Failure(description: "the OTLP receiver (python3) did not start: \(line)")
        }
        self.port = port
    }

    /// The spans of every export so far, as OTLP/JSON objects (`resourceSpans[].scopeSpans[].spans[]`).
    package func spans() -> [[String: Any]] {
        guard let text = try? String(contentsOf: file, encoding: .utf8) else { return [] }
        return text.split(separator: "\n").flatMap { line -> [[String: Any]] in
            guard let export = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else {
                return []
            }
            let resources = export["resourceSpans"] as? [[String: Any]] ?? []
            return resources.flatMap { ($0["scopeSpans"] as? [[String: Any]] ?? []) }
                .flatMap { $0["spans"] as? [[String: Any]] ?? [] }
        }
    }

    /// The log records of every export so far, as OTLP/JSON objects
    /// (`resourceLogs[].scopeLogs[].logRecords[]`).
    package func logRecords() -> [[String: Any]] {
        guard let text = try? String(contentsOf: file, encoding: .utf8) else { return [] }
        return text.split(separator: "\n").flatMap { line -> [[String: Any]] in
            guard let export = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any] else {
                return []
            }
            let resources = export["resourceLogs"] as? [[String: Any]] ?? []
            return resources.flatMap { ($0["scopeLogs"] as? [[String: Any]] ?? []) }
                .flatMap { $0["logRecords"] as? [[String: Any]] ?? [] }
        }
    }

    /// Waits up to `timeout` seconds for a log record `matching`.
    package func logRecord(timeout: Double = 10, matching: ([String: Any]) -> Bool) -> [String: Any]? {
        let deadline = Date().addingTimeInterval(timeout)
        repeat {
            if let record = logRecords().first(where: matching) { return record }
            usleep(100_000)
        } while Date() < deadline
        return nil
    }

    /// Waits up to `timeout` seconds for a span `matching`.
    package func span(timeout: Double = 10, matching: ([String: Any]) -> Bool) -> [String: Any]? {
        let deadline = Date().addingTimeInterval(timeout)
        repeat {
            if let span = spans().first(where: matching) { return span }
            usleep(100_000)
        } while Date() < deadline
        return nil
    }

    /// OTLP/JSON writes IDs in base64: as lowercase hex.
    package static func hex(_ base64: Any?) -> String {
        guard let text = base64 as? String, let data = Data(base64Encoded: text) else { return "" }
        return data.map { String(format: "%02x", $0) }.joined()
    }

    /// An OTLP attribute list as a dictionary of its values as text.
    package static func attributes(_ list: Any?) -> [String: String] {
        var result: [String: String] = [:]
        for attribute in list as? [[String: Any]] ?? [] {
            guard let key = attribute["key"] as? String, let value = attribute["value"] as? [String: Any] else {
                continue
            }
            result[key] = value.values.first.map { "\($0)" }
        }
        return result
    }

    package func stop() {
        if process.isRunning {
            // SIGKILL: a child inherits the test process's blocked signals, SIGTERM among them.
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        try? FileManager.default.removeItem(at: file)
    }
}
