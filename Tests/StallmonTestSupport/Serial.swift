import Testing

/// Suites that run child processes with real stalls, a real journald or a real systemd, or real
/// monitors in the test process. They run one at a time: on two cores, a stall that burns CPU next
/// to another would change what both measure.
///
/// A suite of any test target joins them by nesting in an extension
/// (`extension Serial { @Suite struct … }`): swift-testing files it under this type whatever module
/// declares it (its ID reads `StallmonTestSupport.Serial/…`), and `swift test` runs every target in
/// one process, so the suites of all targets run one at a time together.
@Suite(.serialized)
package enum Serial {}
