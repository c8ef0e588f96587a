"""Remote: the Remote Execution API (REAPI v2) cache and execution clients, Bazel's HTTP cache
protocol and the Remote Workers API worker (optional extra ``buildtool[remote]``).

Nothing here is imported unless a remote option is set; ``grpc`` is imported lazily inside
the gRPC client so the core install stays small and fast to start.  Docs: docs/remote.md
"""

import os as _os

# gRPC's C core prints its own errors to stderr (a TLS handshake against a plain server:
# "ssl_transport_security.cc ... Handshake failed"); buildtool says what failed in one
# warning of its own.  A user's own GRPC_VERBOSITY still wins.
_os.environ.setdefault("GRPC_VERBOSITY", "NONE")
