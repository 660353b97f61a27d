import Testing

/// Suites that run child processes with real stalls, a real journald or a real systemd. They run
/// one at a time: on two cores, a stall that burns CPU next to another would change what both
/// measure.
@Suite(.serialized)
enum Serial {}
