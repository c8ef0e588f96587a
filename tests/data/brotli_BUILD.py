# BUILD.py for the brotli C library as shipped in the Brotli sdist (c/common, c/dec,
# c/enc, c/tools), written with buildtool's cc macros.  The test targets mirror brotli's
# own CMake tests: the compatibility test decompresses every tests/testdata/*.compressed*
# file and compares it with the original; the round-trip test compresses the same inputs
# as upstream at several qualities and decompresses them again.
from buildtool.cc import cc_binary, cc_library
from buildtool.dsl import glob, test

COPTS = ["-O1"]
INCLUDES = ["c/include"]

cc_library(name="brotlicommon", srcs=glob(["c/common/*.c"]), includes=INCLUDES, copts=COPTS)
cc_library(name="brotlidec", srcs=glob(["c/dec/*.c"]), includes=INCLUDES, copts=COPTS, deps=[":brotlicommon"])
cc_library(name="brotlienc", srcs=glob(["c/enc/*.c"]), includes=INCLUDES, copts=COPTS, deps=[":brotlicommon"])
cc_binary(
    name="brotli",
    srcs=["c/tools/brotli.c"],
    includes=INCLUDES,
    copts=COPTS,
    deps=[":brotlienc", ":brotlidec"],
    linkopts=["-lm"],
)

test(
    name="compatibility_test",
    srcs=[":brotli", *glob(["tests/testdata/*"])],
    cmd="""
n=0
for f in tests/testdata/*.compressed*; do
    ./brotli --force --decompress "$f" --output="$TMPDIR/out"
    cmp "$TMPDIR/out" "${f%.compressed*}"
    n=$$((n + 1))
done
echo "compatibility: $n files decompressed and compared"
test "$n" -ge 30
""",
)

ROUNDTRIP_INPUTS = [
    "tests/testdata/alice29.txt",
    "tests/testdata/asyoulik.txt",
    "tests/testdata/lcet10.txt",
    "tests/testdata/plrabn12.txt",
    "c/enc/encode.c",
    "c/common/dictionary.h",
    "c/dec/decode.c",
]

test(
    name="roundtrip_test",
    srcs=[":brotli", *ROUNDTRIP_INPUTS],
    cmd=f"""
for f in {" ".join(ROUNDTRIP_INPUTS)}; do
    for q in 1 6 9 11; do
        ./brotli --force --quality=$q "$f" --output="$TMPDIR/x.br"
        ./brotli --force --decompress "$TMPDIR/x.br" --output="$TMPDIR/x"
        cmp "$TMPDIR/x" "$f"
    done
done
echo roundtrip: ok
""",
)
