"""The picker's pure core: metrics parsing, the bounded prefix index, the scorers and the pick.
No I/O, no gRPC, no inferway layer above the base: the server and the benchmark drive it."""
