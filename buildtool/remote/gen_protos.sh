#!/bin/sh
# Regenerate the Python modules of buildtool/remote/protos/ (needs: pip install grpcio-tools).
# The generated *_pb2.py / *_pb2_grpc.py are committed so users need only grpcio + protobuf.
set -eu
cd "$(dirname "$0")/protos"
PROTOS=$(find . -name '*.proto' | sort)
python3 -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. $PROTOS
# Generated imports are absolute ("from google.rpc import status_pb2"); make them relative to
# this package so they never clash with another google.* distribution.
python3 - <<'PY'
import pathlib, re
for p in pathlib.Path(".").rglob("*_pb2*.py"):
    s = p.read_text()
    s = re.sub(r"^from (google\.(?:rpc|longrunning|bytestream|devtools\.remoteworkers\.v1test2)|build\.bazel\.remote\.execution\.v2|build\.bazel\.semver) import",
               r"from buildtool.remote.protos.\1 import", s, flags=re.M)
    p.write_text(s)
PY
find . -type d -exec sh -c 'touch "$1/__init__.py"' _ {} \;
