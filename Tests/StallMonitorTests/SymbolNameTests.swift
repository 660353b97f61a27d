import Testing

@testable import StallMonitor

struct SymbolNameTests {
    @Test(arguments: [
        ("StallDemo.Service.refresh() -> ()", "Service.refresh()"),
        ("StallDemo.Service.refresh(force: Swift.Bool, _: Swift.Int) -> Swift.String", "Service.refresh(force:_:)"),
        (
            "closure #1 @Sendable (Foundation.Timer) -> () in StallDemo.Service.run() -> ()",
            "closure #1 in Service.run()"
        ),
        ("static StallmonFixture.Stalls.burnCPU(milliseconds: Swift.Int) -> ()", "Stalls.burnCPU(milliseconds:)"),
        ("StallDemo.spin(milliseconds: Swift.Int) -> ()", "spin(milliseconds:)"),
        (
            "closure #2 () -> () in closure #1 @Sendable () -> () in static X.Y.run(_: Swift.String) throws -> ()",
            "closure #2 in closure #1 in Y.run(_:)"
        ),
        ("Swift.IndexingIterator.next() -> Swift.Optional<A.Element>", "IndexingIterator.next()"),
        ("(extension in StallDemo):Foundation.RunLoop.spin() -> ()", "RunLoop.spin()"),
        ("__CFRunLoopRun", "__CFRunLoopRun"),
        (
            "closure #1 in stallmon.Demo.(schedule in _D49913FBF4B70A2C475958D7133FA7DA)(after: Swift.Double, _: @Sendable () -> ()) -> ()",
            "closure #1 in Demo.schedule(after:_:)"
        ),
        (
            "reabstraction thunk helper from @escaping @callee_guaranteed @Sendable () -> () to @escaping @callee_unowned @convention(block) () -> ()",
            "reabstraction thunk"
        ),
    ])
    func demangledNamesAreShortenedAsPeopleWriteThem(_ demangled: String, _ expected: String) {
        #expect(SwiftSymbolName.simplify(demangled) == expected)
    }

    @Test func swiftSymbolsAreDemangled() {
        #expect(
            Symbolicator.demangle("$s15StallmonFixture6StallsO7burnCPU12millisecondsySi_tFZ")
                == "static StallmonFixture.Stalls.burnCPU(milliseconds: Swift.Int) -> ()")
        #expect(Symbolicator.demangle("main") == nil)
        #expect(
            Symbolicator.demangle("_ZNSt6vectorIiSaIiEE9push_backERKi")
                == "std::vector<int, std::allocator<int> >::push_back(int const&)")
    }
}
