import CoreFoundation
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// An AF_UNIX datagram socket standing in for systemd's `$NOTIFY_SOCKET`.
package final class NotifySocket: @unchecked Sendable {
    package let path: String
    private let descriptor: Int32
    private let lock = NSLock()
    private var received: [(time: UInt64, text: String)] = []
    private let done = DispatchSemaphore(value: 0)

    package init() throws {
        path = "/tmp/stallmon-notify-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).sock"
        descriptor = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { bytes in
            for (index, byte) in path.utf8.enumerated() { bytes[index] = byte }
        }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard bound == 0 else { throw POSIXError(.init(rawValue: errno) ?? .EIO) }
        var timeout = timeval(tv_sec: 0, tv_usec: 100_000)
        setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        Thread.detachNewThread { [self] in receive() }
    }

    private func receive() {
        var buffer = [UInt8](repeating: 0, count: 4096)
        while done.wait(timeout: .now()) == .timedOut {
            let count = recv(descriptor, &buffer, buffer.count, 0)
            guard count > 0 else { continue }
            var now = timespec()
            clock_gettime(CLOCK_MONOTONIC, &now)
            let time = UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
            let text = String(decoding: buffer[0..<count], as: UTF8.self)
            lock.lock()
            received.append((time, text))
            lock.unlock()
        }
    }

    package func messages() -> [(time: UInt64, text: String)] {
        lock.lock()
        defer { lock.unlock() }
        return received
    }

    package func close() {
        done.signal()
        usleep(200_000)
        Glibc.close(descriptor)
        unlink(path)
    }
}
