#if STALLMON_LINUX
import CStallCapture
import CoreFoundation
import Synchronization

/// Where CoreFoundation calls out to each kind of callback, learned by a probe run rather than
/// read from its local symbols, which a stripped libFoundation does not have. A stack that holds
/// a call site's return address called out there; one inside libdispatch's exported
/// `_dispatch_main_queue_callback_4CF` ran a main-queue block.
enum CalloutSites {
    private static let probed = Atomic<Bool>(false)

    /// Runs the loop of the calling thread once in a private mode, with a timer, a source0, an
    /// observer and a block of the probe's own, each of which records its call site (once per
    /// process: the sites are CoreFoundation's, the same for every loop). The mode holds nothing
    /// else, so no work of the program runs, and no observer of the monitor sees the run.
    static func probe() {
        guard !probed.exchange(true, ordering: .acquiringAndReleasing) else { return }
        let runLoop = CFRunLoopGetCurrent()
        let mode = RunLoopModes.cfString("stallmon.probe")

        typealias TimerCallout = @convention(c) (UnsafeMutableRawPointer?, UnsafeMutableRawPointer?) -> Void
        typealias ObserverCallout = @convention(c) (UnsafeMutableRawPointer?, UInt, UnsafeMutableRawPointer?) -> Void
        let timerCallout: TimerCallout = stallmon_probe_timer
        let observerCallout: ObserverCallout = stallmon_probe_observer
        let timer = CFRunLoopTimerCreate(
            kCFAllocatorDefault, CFAbsoluteTimeGetCurrent(), 0, 0, 0,
            unsafeBitCast(timerCallout, to: CFRunLoopTimerCallBack.self), nil)
        var context = CFRunLoopSourceContext()
        context.perform = stallmon_probe_source0
        let source = CFRunLoopSourceCreate(kCFAllocatorDefault, 0, &context)
        let observer = CFRunLoopObserverCreate(
            kCFAllocatorDefault, CFRunLoopActivity.beforeTimers.rawValue, true, 0,
            unsafeBitCast(observerCallout, to: CFRunLoopObserverCallBack.self), nil)
        CFRunLoopAddTimer(runLoop, timer, mode)
        CFRunLoopAddSource(runLoop, source, mode)
        CFRunLoopAddObserver(runLoop, observer, mode)
        CFRunLoopPerformBlock(runLoop, mode) { stallmon_callout_site_record(STALLMON_CALLOUT_SITE_BLOCK) }
        CFRunLoopSourceSignal(source)
        for _ in 0..<10 where !allRecorded {
            _ = CFRunLoopRunInMode(mode, 0.005, true)
        }
        CFRunLoopTimerInvalidate(timer)
        CFRunLoopSourceInvalidate(source)
        CFRunLoopObserverInvalidate(observer)
    }

    private static var allRecorded: Bool {
        (0..<STALLMON_CALLOUT_SITE_COUNT.rawValue).allSatisfy {
            stallmon_callout_site_address(stallmon_callout_site(rawValue: $0)) != 0
        }
    }

    private static let kinds: [(stallmon_callout_site, StallReport.Callout)] = [
        (STALLMON_CALLOUT_SITE_TIMER, .timer), (STALLMON_CALLOUT_SITE_SOURCE0, .source0),
        (STALLMON_CALLOUT_SITE_OBSERVER, .observer), (STALLMON_CALLOUT_SITE_BLOCK, .performBlock),
    ]

    private static let mainQueueCallback: Range<UInt>? = {
        var start: UInt = 0
        var end: UInt = 0
        guard stallmon_exported_function_range("_dispatch_main_queue_callback_4CF", &start, &end) == 1 else {
            return nil
        }
        return start..<end
    }()

    /// The callout kind whose call site is `address` (a return address), if any.
    static func kind(at address: UInt) -> StallReport.Callout? {
        guard address != 0 else { return nil }
        for (site, kind) in kinds where stallmon_callout_site_address(site) == address { return kind }
        if let range = mainQueueCallback, range.contains(address) || range.contains(address &- 1) {
            return .mainQueue
        }
        return nil
    }

    /// Kinds whose call site the probe did not find (empty once it ran).
    static var missing: [StallReport.Callout] {
        kinds.filter { stallmon_callout_site_address($0.0) == 0 }.map(\.1)
            + (mainQueueCallback == nil ? [.mainQueue] : [])
    }
}

extension StallReport.Callout {
    /// The CoreFoundation functions that call each kind out (their frames sit right above the
    /// callout), and the light drain of an async main, which calls the main queue's drain.
    static let runLoopFunctionNames: [String: Self] = [
        "stallmon_async_main_light_drain": .mainQueue,
        "__CFRUNLOOP_IS_CALLING_OUT_TO_A_TIMER_CALLBACK_FUNCTION__": .timer,
        "__CFRUNLOOP_IS_CALLING_OUT_TO_A_SOURCE0_PERFORM_FUNCTION__": .source0,
        "__CFRUNLOOP_IS_CALLING_OUT_TO_A_SOURCE1_PERFORM_FUNCTION__": .source1,
        "__CFRUNLOOP_IS_SERVICING_THE_MAIN_DISPATCH_QUEUE__": .mainQueue,
        "__CFRUNLOOP_IS_CALLING_OUT_TO_AN_OBSERVER_CALLBACK_FUNCTION__": .observer,
        "__CFRUNLOOP_IS_CALLING_OUT_TO_A_BLOCK__": .performBlock,
    ]

    /// The run loop's innermost callout on a stack (frames innermost first): by the names of
    /// CoreFoundation's callout functions, or, where its local symbols are missing, by the call
    /// sites the probe run learned (``CalloutSites``). A main-queue callout that runs a Swift job
    /// (`swift_job_run` between it and the stalling code) is a main-actor job.
    static func recognizeRunLoopCallout(_ frames: [StallFrame]) -> Self {
        var runsSwiftJob = false
        for frame in frames {
            if frame.symbol == "swift_job_run" { runsSwiftJob = true }
            guard let kind = frame.symbol.flatMap({ runLoopFunctionNames[$0] }) ?? CalloutSites.kind(at: frame.address)
            else { continue }
            return kind == .mainQueue && runsSwiftJob ? .mainActor : kind
        }
        return .unknown
    }
}
#endif  // STALLMON_LINUX
