import Testing

@testable import StallMonitor

/// What an event loop was running, read off a stalled loop's frames (innermost first).
struct EventLoopCalloutTests {
    static func frame(_ function: String) -> StallFrame {
        StallFrame(address: 0x1000, symbol: function, function: function)
    }

    @Test(arguments: [
        ("closure #1 in EventLoopFuture.map<A>(_:)", StallReport.Callout.futureCallback),
        ("CallbackList._run()", .futureCallback),
        ("ChannelHandlerContext.invokeWrite(_:promise:)", .channelWrite),
        ("ChannelPipeline.flush()", .channelWrite),
        ("ChannelHandlerContext.invokeChannelRead(_:)", .channelRead),
        ("BaseStreamSocketChannel.readFromSocket()", .channelRead),
        ("closure #1 in SelectableEventLoop._prepareToSchedule<A>(task:in:_:)", .scheduledTask),
        ("SelectableEventLoop.run()", .executeTask),
    ])
    func innermostFrameThatTellsNamesTheWork(function: String, expected: StallReport.Callout) {
        let frames = [Self.frame("Handler.slowPath()"), Self.frame(function), Self.frame("SelectableEventLoop.run()")]
        #expect(StallReport.Callout.recognizeEventLoopWork(frames) == expected)
    }

    @Test func typesInTheParameterListTellNothing() {
        // `EventLoopPromise<A>` and `ChannelHandlerContext` appear only among the parameters.
        let frames = [
            Self.frame("Handler.reply(promise: EventLoopPromise<A>, context: ChannelHandlerContext.write)"),
            Self.frame("SelectableEventLoop.run()"),
        ]
        #expect(StallReport.Callout.recognizeEventLoopWork(frames) == .executeTask)
    }

    @Test func aFrameWithOnlyItsSymbolIsSimplifiedFirst() {
        let frames = [
            StallFrame(
                address: 0x1000,
                symbol: "NIOCore.ChannelHandlerContext.invokeChannelRead(NIOCore.NIOAny) -> ()")
        ]
        #expect(StallReport.Callout.recognizeEventLoopWork(frames) == .channelRead)
    }

    @Test func framesWithoutEventLoopWorkAreNotRecognized() {
        let frames = [Self.frame("Service.refresh()"), Self.frame("main"), StallFrame(address: 0x2000)]
        #expect(StallReport.Callout.recognizeEventLoopWork(frames) == nil)
        #expect(StallReport.Callout.recognizeEventLoopWork([]) == nil)
        // A name shorter than every needle, and one that is a needle's prefix only.
        #expect(StallReport.Callout.recognizeEventLoopWork([Self.frame("f")]) == nil)
        #expect(StallReport.Callout.recognizeEventLoopWork([Self.frame("SelectableEventLoop.ru")]) == nil)
    }
}
