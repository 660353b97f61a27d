import Foundation

/// EXAMPLE_BACKGROUND_STALL_MS=N: one second after start, a task of the service's own (made by
/// `main()`, in no request) spins N ms on the pool, and prints its answer as a JSON line.
public enum BackgroundStall {
    public static func start() {
        guard let text = ProcessInfo.processInfo.environment["EXAMPLE_BACKGROUND_STALL_MS"],
            let milliseconds = Int(text)
        else { return }
        Task {
            try await Task.sleep(for: .seconds(1))
            ServiceOutput.line(["background": spinInHandler(milliseconds: milliseconds).json])
        }
    }
}
