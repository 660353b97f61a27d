extension StallReport.Callout {
    /// What an event loop (SwiftNIO) was running, from the innermost frame that tells: a future's
    /// callback, a channel write or read through its pipeline, a scheduled task or an `execute`
    /// task.
    static func recognizeEventLoopWork(_ frames: [StallFrame]) -> Self? {
        for frame in frames {
            // The function's name only, as the backtrace shows it (`closure #1 in
            // SelectableEventLoop._prepareToSchedule<A>`): parameter and closure types
            // (`promise: EventLoopPromise<A>`) tell nothing.
            guard let name = frame.function ?? frame.symbol.map(SwiftSymbolName.simplify),
                let symbol = name.split(separator: "(", maxSplits: 1).first
            else { continue }
            if let kind = eventLoopPatterns.first(where: { pattern in
                pattern.needles.contains { symbol.contains($0) }
            })?.kind {
                return kind
            }
        }
        return nil
    }

    /// Checked in this order on each frame, innermost frame first.
    private static let eventLoopPatterns: [(kind: Self, needles: [String])] = [
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
}
