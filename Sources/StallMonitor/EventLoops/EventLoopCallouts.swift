extension StallReport.Callout {
    /// What an event loop (SwiftNIO) was running, from the innermost frame that tells: a future's
    /// callback, a channel write or read through its pipeline, a scheduled task or an `execute`
    /// task. Names are matched as the symbolicator prints them (`ChannelHandlerContext.fireChannelRead(_:)`).
    static func recognizeEventLoopWork(_ frames: [StallFrame]) -> Self? {
        for frame in frames {
            guard let symbol = frame.symbol else { continue }
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
        (.futureCallback, ["CallbackList._run", "EventLoopFuture", "EventLoopPromise"]),
        (
            .channelWrite,
            [
                "ChannelPipeline.write", "ChannelPipeline.flush", "ChannelHandlerContext.write",
                "ChannelHandlerContext.flush", "ChannelPipeline.fireChannelWritabilityChanged",
            ]
        ),
        (
            .channelRead,
            [
                "ChannelPipeline.fireChannelRead", "ChannelHandlerContext.fireChannelRead",
                "ChannelHandlerContext.invokeChannelRead", "BaseStreamSocketChannel.readFromSocket",
                "BaseSocketChannel.readable", "SelectableEventLoop.handleEvent",
            ]
        ),
        (.scheduledTask, ["scheduleTask", "ScheduledTask", "scheduleRepeated"]),
        (.executeTask, ["SelectableEventLoop.run(", "runOneLoopTick", "SelectableEventLoop.execute"]),
    ]
}
