package enum ProgramName {
    /// The name the program was started as, like `program_invocation_short_name`.
    package static let current: String = {
        let path = CommandLine.arguments.first ?? ""
        let name = path.lastIndex(of: "/").map { String(path[path.index(after: $0)...]) } ?? path
        return name.isEmpty ? "stallmon" : name
    }()
}
