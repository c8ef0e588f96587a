# The root package (label prefix "//:").
#
# `group` is buildtool's answer to a phony Make target: building it builds its deps.
#   buildtool build //:all_artifacts
group(
    name="all_artifacts",
    deps=[
        "//gen:greetings",
        "//gen:version",
        "//lib:greetlib",
        "//app:greet",
        "//app:help",
    ],
)
