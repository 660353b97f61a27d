/// What configures a `StallMonitor`, apart from the monitor: the collector and the CLI read and
/// check the monitor's configuration without linking its capture code (libunwind, libdw).
/// `StallMonitor.Configuration` is ``StallMonitoring/Configuration``.
public enum StallMonitoring {}
