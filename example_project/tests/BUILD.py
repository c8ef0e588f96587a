# //tests: tests of the artifacts.  `buildtool test //...` builds what they need, then
# runs them; `buildtool build` never runs tests.

test(
    name="greet_test",
    srcs=["greet_test.sh"],
    deps=["//app:greet"],
    # Paths are substituted relative to this package: ../app/dist/greet
    cmd="sh $(location greet_test.sh) $(location //app:greet)",
)

test(
    name="tables_test",
    # A label may also name a source file of another package (//gen:greetings.csv).
    srcs=["check_tables.py", "//gen:greetings", "//gen:greetings.csv", "//gen:version", "//gen:app.json"],
    cmd="python3 $(location check_tables.py) $(location //gen:greetings) "
    "$(location //gen:greetings.csv) $(location //gen:version) $(location //gen:app.json)",
    env={"PYTHONDONTWRITEBYTECODE": "1"},
)
