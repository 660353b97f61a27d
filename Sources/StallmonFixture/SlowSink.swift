import StallMonitor

#if canImport(Glibc)
import Glibc
#endif

/// A user's sink that blocks in every event (a remote pager that does not answer, a full pipe):
/// `--slow-sink-ms N` adds it beside the others.
struct SlowSink: ReportSink {
    let milliseconds: Int

    func emit(_ event: StallMonitorEvent) {
        usleep(UInt32(milliseconds) * 1000)
    }
}
