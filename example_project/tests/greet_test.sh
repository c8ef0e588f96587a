#!/bin/sh
# End-to-end test of the built artifact.  Usage: greet_test.sh PATH/TO/greet
set -eu
greet=$1

fail() { echo "FAIL: $*" >&2; exit 1; }

check() {  # check EXPECTED ARGS...
    expected=$1; shift
    actual=$("$greet" "$@") || fail "greet $* exited with $?"
    [ "$actual" = "$expected" ] || fail "greet $*: expected '$expected', got '$actual'"
}

[ -x "$greet" ] || fail "$greet is not executable"

check "Bonjour, Ada!"              --lang fr ada
check "Hola, Ada, Alan and Grace Hopper!" -l es Ada alan "GRACE  hopper"
check "HALLO, WORLD!"              --lang de --shout
"$greet" --version | grep -q '^greet [0-9]' || fail "--version"

# An unknown language falls back to the default and warns on stderr.
err=$("$greet" --lang xx Ada 2>&1 >/dev/null)
case $err in *"unknown language 'xx'"*) ;; *) fail "no warning for an unknown language: $err" ;; esac

echo "greet: all checks passed"
