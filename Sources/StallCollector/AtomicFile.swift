import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Replaces a file in one step: the new contents go to a temporary file in the same directory,
/// which is flushed to disk and renamed over the old one. Readers see the old file or the new one,
/// never a half-written one.
enum AtomicFile {
    struct WriteError: Error, CustomStringConvertible {
        var path: String
        var operation: String
        var errno: Int32
        var description: String { "\(path): \(operation) failed: \(String(cString: strerror(errno)))" }
    }

    static func write(_ data: Data, to path: String, mode: mode_t = 0o644) throws(WriteError) {
        let directory = (path as NSString).deletingLastPathComponent
        // A fresh random name, created exclusively: whoever else may write the directory cannot
        // plant a link or a file there for us to follow, truncate or chmod.
        var temporary = ""
        var descriptor: Int32 = -1
        for _ in 0..<16 {
            temporary = "\(directory)/.\((path as NSString).lastPathComponent).\(randomSuffix()).tmp"
            descriptor = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode)
            if descriptor >= 0 || errno != EEXIST { break }
        }
        guard descriptor >= 0 else { throw WriteError(path: temporary, operation: "open", errno: errno) }
        var failure: WriteError?
        data.withUnsafeBytes { bytes in
            var offset = 0
            while offset < bytes.count {
                let written = Glibc.write(descriptor, bytes.baseAddress! + offset, bytes.count - offset)
                if written < 0, errno == EINTR { continue }
                if written <= 0 {
                    failure = WriteError(path: temporary, operation: "write", errno: errno)
                    return
                }
                offset += written
            }
        }
        if failure == nil, fchmod(descriptor, mode) != 0 {
            failure = WriteError(path: temporary, operation: "fchmod", errno: errno)
        }
        if failure == nil, fsync(descriptor) != 0 {
            failure = WriteError(path: temporary, operation: "fsync", errno: errno)
        }
        close(descriptor)
        if failure == nil, rename(temporary, path) != 0 {
            failure = WriteError(path: path, operation: "rename", errno: errno)
        }
        if let failure {
            unlink(temporary)
            throw failure
        }
        let directoryDescriptor = open(directory, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        if directoryDescriptor >= 0 {
            fsync(directoryDescriptor)
            close(directoryDescriptor)
        }
    }

    /// 16 random hex digits.
    private static func randomSuffix() -> String {
        let value = UInt64.random(in: 0...UInt64.max)
        let digits = String(value, radix: 16)
        return String(repeating: "0", count: 16 - digits.count) + digits
    }
}
