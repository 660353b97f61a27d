import Foundation
import StallJournal

/// Opens the journal for `report` and `follow`, and refuses one the user may not read.
enum JournalSource {
    /// The local journal (or a namespace's), with every file readable.
    ///
    /// `sd_journal_open` succeeds for a user outside the `systemd-journal` group and silently skips
    /// the files it may not read: without this check such a user would be told "no stalls".
    /// - Throws: ``ExitStatus/unavailable`` after saying why on standard error.
    static func open(namespace: String?, command: String) throws -> JournalReader {
        let reader: JournalReader
        do {
            reader = try JournalReader(namespace: namespace)
        } catch {
            complain(command, "cannot read the journal: \(error)")
            throw ExitStatus.unavailable
        }
        let denied = reader.unreadablePaths()
        if let first = denied.first {
            let more = denied.count > 1 ? " (and \(denied.count - 1) more)" : ""
            complain(
                command,
                "cannot read the journal: permission denied for \(DisplayText.escaped(first))\(more); "
                    + "run as root or as a member of the systemd-journal (or adm) group")
            throw ExitStatus.unavailable
        }
        return reader
    }

    /// The readers `report` reads: one per `--directory`, else every journal (`--merge`), else
    /// the local journal (or a namespace's), as ``open(namespace:command:)``.
    /// - Throws: ``ExitStatus/unavailable`` after saying why on standard error.
    static func open(namespace: String?, directories: [String], merge: Bool, command: String) throws
        -> [JournalReader]
    {
        if directories.isEmpty, !merge { return [try open(namespace: namespace, command: command)] }
        do {
            if merge { return [try JournalReader(merge: true)] }
            var readers: [JournalReader] = []
            for directory in directories {
                // sd_journal_open_directory opens a missing or empty directory without a word.
                var isDirectory: ObjCBool = false
                guard FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory),
                    isDirectory.boolValue
                else {
                    complain(command, "cannot read the journal: \(DisplayText.escaped(directory)) is not a directory")
                    throw ExitStatus.unavailable
                }
                guard access(directory, R_OK | X_OK) == 0 else {
                    complain(
                        command, "cannot read the journal: permission denied for \(DisplayText.escaped(directory))")
                    throw ExitStatus.unavailable
                }
                readers.append(try JournalReader(directory: directory))
            }
            return readers
        } catch let error as SystemdError {
            complain(command, "cannot read the journal: \(error)")
            throw ExitStatus.unavailable
        }
    }

    static func complain(_ command: String, _ message: String) {
        FileHandle.standardError.write(Data("stallmon \(command): \(message)\n".utf8))
    }
}

/// JSON text safe for a terminal.
enum JSONText {
    /// `json` with DEL, the C1 controls, the bidirectional controls and the line and paragraph
    /// separators escaped as `\uXXXX`: `JSONEncoder` and `JSONSerialization` escape only C0. These
    /// characters occur only inside strings, so the text stays the same JSON.
    static func escapingControls(_ json: String) -> String {
        guard json.unicodeScalars.contains(where: needsEscape) else { return json }
        var result = ""
        result.reserveCapacity(json.utf8.count)
        for scalar in json.unicodeScalars {
            if needsEscape(scalar) {
                let hex = String(scalar.value, radix: 16)
                result += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            } else {
                result.unicodeScalars.append(scalar)
            }
        }
        return result
    }

    private static func needsEscape(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar.value {
        case 0x7F...0x9F, 0x061C, 0x200E, 0x200F, 0x2028...0x202E, 0x2066...0x2069: true
        default: false
        }
    }
}
