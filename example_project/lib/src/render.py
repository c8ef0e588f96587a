"""Turning a greeting and a list of people into a sentence."""


def render(greeting, who, shout=False):
    """Build the sentence.

    >>> render("Hello", "Ada and Alan")
    'Hello, Ada and Alan!'
    >>> render("Hola", "Grace", shout=True)
    'HOLA, GRACE!'
    """
    text = f"{greeting}, {who}!"
    return text.upper() if shout else text
