# The entry point of app/dist/greet.  //app:greet concatenates, in this order:
#   gen/version.py          APP_NAME, APP_VERSION, APP_DESCRIPTION
#   gen/greetings_table.py  GREETINGS
#   lib/greetlib.py         pick_greeting, join_names, render
#   app/main.py             this file
# into one self-contained script, so the names above are globals here.

import argparse

DEFAULT_LANG = "@DEFAULT_LANG@"  # replaced at build time (see app/BUILD.py)


def main(argv=None):
    parser = argparse.ArgumentParser(prog=APP_NAME, description=APP_DESCRIPTION)
    parser.add_argument("names", nargs="*", help="people to greet (default: World)")
    parser.add_argument(
        "-l", "--lang", default="",
        help="language code, one of: " + ", ".join(sorted(GREETINGS))
        + " (default: " + DEFAULT_LANG + ")",
    )
    parser.add_argument("--shout", action="store_true", help="greet loudly")
    parser.add_argument("--version", action="version", version=APP_NAME + " " + APP_VERSION)
    args = parser.parse_args(argv)
    greeting = pick_greeting(GREETINGS, args.lang, DEFAULT_LANG)
    print(render(greeting, join_names(args.names), shout=args.shout))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
