# //native: a small C library, a program using it and a unit test, written with the
# cc macros (docs/cc.md).  Each .c file is compiled by its own target with a depfile, so
# editing include/native/format.h rebuilds format.o, main.o and the test's object, but
# never wordcount.o.  Without a C compiler on PATH these targets are declared manual=True
# and `buildtool build //...` / `buildtool test //...` skip them.
from buildtool.cc import cc_binary, cc_library, cc_test

COPTS = ["-O2", "-Wall", "-Werror", "-std=c99"]

cc_library(
    name="wordcount",
    srcs=["wordcount.c", "format.c"],
    includes=["include"],
    copts=COPTS,
)

cc_binary(
    name="wc",
    srcs=["main.c"],
    deps=[":wordcount"],
    includes=["include"],
    copts=COPTS,
)

cc_test(
    name="wordcount_test",
    srcs=["wordcount_test.c"],
    deps=[":wordcount"],
    includes=["include"],
    copts=COPTS,
)
