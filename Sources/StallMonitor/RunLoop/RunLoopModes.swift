import CoreFoundation
import Foundation

/// Conversions between run-loop mode names and CoreFoundation strings.
enum RunLoopModes {
    static func string(_ mode: CFString) -> String {
        let length = CFStringGetLength(mode)
        let capacity = CFStringGetMaximumSizeForEncoding(length, CFStringBuiltInEncodings.UTF8.rawValue) + 1
        var buffer = [CChar](repeating: 0, count: Int(capacity))
        guard CFStringGetCString(mode, &buffer, capacity, CFStringBuiltInEncodings.UTF8.rawValue) else { return "?" }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    static func cfString(_ name: String) -> CFString {
        CFStringCreateWithCString(kCFAllocatorDefault, name, CFStringBuiltInEncodings.UTF8.rawValue)
    }
}
