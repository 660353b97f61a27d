#if STALLMON_LINUX
import CStallCapture
import CSymbolize
import StallJournal

#if canImport(Glibc)
import Glibc
#endif

/// Turns captured addresses into ``StallFrame``s through libdw, with demangled names, inline
/// frames and file:line where DWARF exists. Lookups are cached per address.
///
/// - Important: Not thread-safe. The reporting thread owns it; it never runs on a monitored thread.
///   stallmond's watch from outside makes one per watched process, on its scan thread.
package final class Symbolicator {
    private var handle: OpaquePointer?
    private var cache: [UInt: [StallFrame]] = [:]
    private var lastRefresh: UInt64 = 0
    private static let cacheLimit = 32_768

    /// The symbolicator of process `pid`'s images (`/proc/PID/maps`): this process's by default.
    package init(pid: pid_t = getpid()) {
        handle = stallmon_symbolizer_create(pid)
        lastRefresh = MonotonicClock.now()
    }

    deinit {
        stallmon_symbolizer_destroy(handle)
    }

    /// Drops the pages of image files that lookups read in (see `stallmon_symbolizer_trim`).
    func trim() {
        guard let handle else { return }
        stallmon_symbolizer_trim(handle)
    }

    /// Symbolicates one captured stack. `frames[0]` is the interrupted instruction; the others are
    /// return addresses, looked up at the call instruction.
    package func symbolicate(_ addresses: [UInt]) -> [StallFrame] {
        addresses.enumerated().flatMap { index, address in frames(for: address, isReturnAddress: index > 0) }
    }

    func frames(for address: UInt, isReturnAddress: Bool) -> [StallFrame] {
        let key = address << 1 | (isReturnAddress ? 1 : 0)
        if let cached = cache[key] { return cached }
        var frames = lookUp(address, isReturnAddress: isReturnAddress)
        if frames.isEmpty, refreshIfStale() {
            frames = lookUp(address, isReturnAddress: isReturnAddress)
        }
        if frames.isEmpty { frames = [StallFrame(address: address)] }
        if cache.count >= Self.cacheLimit { cache.removeAll(keepingCapacity: true) }
        cache[key] = frames
        return frames
    }

    /// The address range of a function found by its symbol name in the image that exports
    /// `neighbor` (in any loaded image when `neighbor` is `nil`, which loads every symbol table).
    func functionRange(named name: String, besides neighbor: String?) -> Range<UInt>? {
        guard let handle else { return nil }
        var start: UInt = 0
        var end: UInt = 0
        guard stallmon_symbolizer_find_function(handle, name, neighbor, &start, &end) == 1, end > start else {
            return nil
        }
        return start..<end
    }

    private func lookUp(_ address: UInt, isReturnAddress: Bool) -> [StallFrame] {
        guard let handle else { return [] }
        var symbols = [stallmon_symbol](repeating: stallmon_symbol(), count: 16)
        let count = Int(stallmon_symbolize(handle, address, isReturnAddress ? 1 : 0, &symbols, Int32(symbols.count)))
        return symbols.prefix(count).map { symbol in
            let raw = symbol.symbol.map { String(cString: $0) }
            let demangled = raw.flatMap(Self.demangle)
            let name = demangled ?? raw
            return StallFrame(
                address: address,
                image: symbol.module_path.map { String(cString: $0) },
                symbol: name,
                function: demangled.map(SwiftSymbolName.simplify) ?? raw,
                offset: symbol.symbol_offset,
                file: symbol.file.map { String(cString: $0) },
                line: Int(symbol.line),
                column: Int(symbol.column),
                isInlined: symbol.inlined != 0
            )
        }
    }

    /// New images (dlopen) are picked up at most once a second.
    private func refreshIfStale() -> Bool {
        guard let handle else { return false }
        let now = MonotonicClock.now()
        guard now - lastRefresh > 1_000_000_000 else { return false }
        lastRefresh = now
        cache.removeAll(keepingCapacity: true)
        return stallmon_symbolizer_refresh(handle) == 0
    }

    static func demangle(_ name: String) -> String? {
        if let swift = stallmon_demangle_swift(name) {
            defer { free(swift) }
            return String(cString: swift)
        }
        if let cxx = stallmon_demangle_cxx(name) {
            defer { free(cxx) }
            return String(cString: cxx)
        }
        return nil
    }
}
#endif  // STALLMON_LINUX
