extension StallReport.Callout {
    /// An event loop's callout, for its reporters: the loop's work ``recognizeEventLoopWork(_:)``
    /// names, `unknown` otherwise.
    static func recognizeEventLoopCallout(_ frames: [StallFrame]) -> Self {
        recognizeEventLoopWork(frames) ?? .unknown
    }

    /// What an event loop (SwiftNIO) was running, from the innermost frame that tells: a future's
    /// callback, a channel write or read through its pipeline, a scheduled task or an `execute`
    /// task.
    static func recognizeEventLoopWork(_ frames: [StallFrame]) -> Self? {
        for frame in frames {
            // The function's name only, as the backtrace shows it (`closure #1 in
            // SelectableEventLoop._prepareToSchedule<A>`): parameter and closure types
            // (`promise: EventLoopPromise<A>`) tell nothing.
            guard let name = frame.function ?? frame.symbol.map(SwiftSymbolName.simplify) else { continue }
            var utf8 = name.utf8[...]
            if let parenthesis = utf8.firstIndex(of: UInt8(ascii: "(")) { utf8 = utf8[..<parenthesis] }
            // On the bytes: every report runs this over every frame, and a frame's name is searched
            // for twenty needles; `String.contains` took most of a report's making (0.2–0.3 ms).
            let kind =
                utf8.withContiguousStorageIfAvailable(kind(named:)) ?? Array(utf8).withUnsafeBufferPointer(kind(named:))
            if let kind { return kind }
        }
        return nil
    }

    private static func kind(named name: UnsafeBufferPointer<UInt8>) -> Self? {
        eventLoopPatterns.first { pattern in pattern.needles.contains { name.contains($0) } }?.kind
    }

    /// Checked in this order on each frame, innermost frame first.
    private static let eventLoopNames: [(kind: Self, needles: [String])] = [
        (.futureCallback, ["CallbackList._run", "EventLoopFuture.", "EventLoopPromise."]),
        (
            .channelWrite,
            [
                "ChannelPipeline.write", "ChannelPipeline.flush", "ChannelHandlerContext.write",
                "ChannelHandlerContext.flush", "ChannelHandlerContext.invokeWrite", "ChannelHandlerContext.invokeFlush",
            ]
        ),
        (
            .channelRead,
            [
                "fireChannelRead", "invokeChannelRead", "BaseStreamSocketChannel.readFromSocket",
                "BaseSocketChannel.readable", "SelectableEventLoop.handleEvent",
            ]
        ),
        (.scheduledTask, ["_prepareToSchedule", "scheduleTask", "ScheduledTask", "scheduleRepeated"]),
        (.executeTask, ["SelectableEventLoop.run", "SelectableEventLoop.execute"]),
    ]

    /// The same, as bytes.
    private static let eventLoopPatterns = eventLoopNames.map {
        (kind: $0.kind, needles: $0.needles.map { Array($0.utf8) })
    }
}

extension UnsafeBufferPointer<UInt8> {
    /// Whether `needle` occurs in these bytes.
    fileprivate func contains(_ needle: [UInt8]) -> Bool {
        guard let first = needle.first, needle.count <= count else { return needle.isEmpty }
        var start = 0
        let last = count - needle.count
        while start <= last {
            if self[start] == first {
                var matched = 1
                while matched < needle.count, self[start + matched] == needle[matched] { matched += 1 }
                if matched == needle.count { return true }
            }
            start += 1
        }
        return false
    }
}
