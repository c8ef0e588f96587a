"""Choosing the greeting for a language, with a fallback."""

import sys


def pick_greeting(table, lang, default_lang):
    """Return the greeting for `lang`, else for `default_lang`, warning on stderr.

    >>> pick_greeting({"en": "Hello", "fr": "Bonjour"}, "fr", "en")
    'Bonjour'
    >>> pick_greeting({"en": "Hello"}, "", "en")
    'Hello'
    """
    if lang in table:
        return table[lang]
    if lang:
        known = ", ".join(sorted(table))
        print(f"unknown language {lang!r} (known: {known})", file=sys.stderr)
    return table[default_lang]
