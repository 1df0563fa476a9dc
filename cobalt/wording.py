"""How counts read in messages, pages and the terminal: one rule for every door."""


def plural(count: int, word: str, many: str | None = None) -> str:
    """`1 error`, `2 errors`, `1,500 items`; `many` for an irregular plural."""
    return f"{count:,} {word if count == 1 else many or word + 's'}"


def install_hint(extra: str) -> str:
    """The command that installs one of Cobalt's optional extras."""
    return f"pip install 'cobalt-agents[{extra}]'"
