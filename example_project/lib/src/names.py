"""Normalising and joining the names of the people to greet."""

import re


def normalize_name(raw):
    """Collapse runs of whitespace and capitalise each word.

    >>> normalize_name("  ada   LOVELACE ")
    'Ada Lovelace'
    """
    return " ".join(word.capitalize() for word in re.split(r"\s+", raw.strip()) if word)


def join_names(names):
    """Join names the way people write them.

    >>> join_names(["Ada"])
    'Ada'
    >>> join_names(["Ada", "Alan", "Grace"])
    'Ada, Alan and Grace'
    """
    names = [normalize_name(n) for n in names if n.strip()]
    if not names:
        return "World"
    if len(names) == 1:
        return names[0]
    return ", ".join(names[:-1]) + " and " + names[-1]
