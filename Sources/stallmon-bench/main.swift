print("stallmon-bench: not yet written")
