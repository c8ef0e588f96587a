"""Remote: the Remote Execution API (REAPI v2) cache and execution clients, Bazel's HTTP cache
protocol and the Remote Workers API worker (optional extra ``buildtool[remote]``).

Nothing here is imported unless a remote option is set; ``grpc`` is imported lazily inside
the gRPC client so the core install stays small and fast to start.  Docs: docs/remote.md
"""
