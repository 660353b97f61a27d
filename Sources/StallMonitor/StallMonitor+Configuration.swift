// Whoever imports StallMonitor configures it: the configuration and its error come with it.
@_exported import StallConfiguration

extension StallMonitor {
    /// How the monitor detects, samples and reports stalls.
    public typealias Configuration = StallMonitoring.Configuration
}
