/// One source-level frame of a stalled thread's stack.
public struct StallFrame: Sendable, Hashable {
    /// The code address (the interrupted instruction for the first frame, a return address otherwise).
    public var address: UInt
    /// Path of the image holding the address, `nil` when it is in no mapped image.
    public var image: String?
    /// The demangled name, `nil` when the address has no symbol.
    public var symbol: String?
    /// The name as a person writes it, e.g. `Service.refresh()`.
    public var function: String?
    /// Bytes from the start of the symbol.
    public var offset: UInt
    public var file: String?
    public var line: Int
    public var column: Int
    /// Whether the compiler inlined this frame into the next one (both share ``address``).
    public var isInlined: Bool

    package init(
        address: UInt, image: String? = nil, symbol: String? = nil, function: String? = nil, offset: UInt = 0,
        file: String? = nil, line: Int = 0, column: Int = 0, isInlined: Bool = false
    ) {
        self.address = address
        self.image = image
        self.symbol = symbol
        self.function = function
        self.offset = offset
        self.file = file
        self.line = line
        self.column = column
        self.isInlined = isInlined
    }

    /// `Service.swift:42`, or `nil` without debug information.
    public var location: String? {
        guard let file, line > 0 else { return nil }
        return "\(file.lastPathComponent):\(line)"
    }

    /// `Service.refresh() (Service.swift:42)`, falling back to the image and offset.
    public var summary: String {
        let name = function ?? symbol ?? "0x\(String(address, radix: 16)) in \(image?.lastPathComponent ?? "?")"
        guard let location else { return name }
        return "\(name) (\(location))"
    }

    /// One line of a backtrace: `0x55d4c1a2b3c4 Service.refresh() + 52 at Service.swift:42 [stallmon]`.
    public var backtraceLine: String {
        var line = "0x" + String(address, radix: 16)
        if let name = function ?? symbol {
            line += " " + name
            if !isInlined, offset > 0 { line += " + \(offset)" }
        }
        if isInlined { line += " [inlined]" }
        if let location { line += " at " + location }
        if let image { line += " [" + image.lastPathComponent + "]" }
        return line
    }

    /// Whether the frame belongs to the C library, the Swift runtime, Foundation, Dispatch or stallmon
    /// itself: places where a stall shows up but which are rarely its cause.
    var isSystemFrame: Bool {
        guard let image = image?.lastPathComponent else { return false }
        return Self.systemImagePrefixes.contains { image.hasPrefix($0) }
    }

    private static let systemImagePrefixes = [
        "libc.so", "libc-", "libpthread", "ld-linux", "libm.so", "libgcc_s", "libstdc++", "libdispatch",
        "libFoundation", "libswiftCore", "libswift_Concurrency", "libswiftDispatch", "libBlocksRuntime",
        "libunwind", "libsystemd", "lib_FoundationICU", "libswiftGlibc", "libswiftSynchronization",
    ]
}

extension String {
    var lastPathComponent: String {
        guard let slash = lastIndex(of: "/") else { return self }
        return String(self[index(after: slash)...])
    }
}
