import Foundation

/// A fresh folder under the temporary directory.
package enum ScratchDirectory {
    package static func make() throws -> String {
        let directory = NSTemporaryDirectory() + "stallmond-links-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        return directory
    }
}
