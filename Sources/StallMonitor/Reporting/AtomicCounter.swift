import Synchronization

/// A counter shared between threads.
final class AtomicCounter: Sendable {
    private let value = Atomic<Int>(0)

    @discardableResult
    func add(_ amount: Int) -> Int { value.add(amount, ordering: .relaxed).newValue }
    func load() -> Int { value.load(ordering: .relaxed) }
    func store(_ newValue: Int) { value.store(newValue, ordering: .relaxed) }
}
