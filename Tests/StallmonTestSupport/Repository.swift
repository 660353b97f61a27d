import Foundation

/// This checkout: the shipped files, the scripts and the examples the tests read and run.
package enum Repository {
    /// The package's folder, found from this file's path (Tests/StallmonTestSupport/Repository.swift).
    package static let root = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent()  // StallmonTestSupport
        .deletingLastPathComponent()  // Tests
        .deletingLastPathComponent()  // the package
}
