"""What a request replay could not answer differs in: the closest recorded request, and a short
word diff of the two (`cobalt run --replay`'s "no recorded response" message).

Frameworks put their own text before the user's (smolagents' and CrewAI's system prompts,
LangChain's chat history), so the first words of the last message say nothing of the change.
Both bodies are flattened into words, each knowing the field it came from (`messages.1.content`);
the recorded request of the item with the most words in common is the closest; the message
quotes only the places where the two differ, with a few words around each, `[-recorded-]
{+sent now+}` as `git diff --word-diff` writes it.
"""

from __future__ import annotations

import difflib
from typing import Any

CONTEXT_WORDS = 4  # words shown either side of a change
CHANGES_SHOWN = 3
WORD_CHARS = 40  # a longer word (a base64 image, a long URL) is cut
CHANGED_WORDS = 12  # of a longer change, the first words
Word = tuple[str, str]  # (field path, word)


def words_of(value: Any, path: str = "") -> list[Word]:
    """The words of a request body, each with the dotted path of the field it is in."""
    if isinstance(value, dict):
        return [w for key in sorted(value) for w in words_of(value[key], _join(path, str(key)))]
    if isinstance(value, list):
        return [w for n, part in enumerate(value) for w in words_of(part, _join(path, str(n)))]
    text = value if isinstance(value, str) else ("null" if value is None else str(value))
    return [(path or "body", word) for word in text.split()] or [(path or "body", '""')]


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _cut(word: str) -> str:
    return word if len(word) <= WORD_CHARS else word[: WORD_CHARS - 1] + "…"


def _few(words: list[Word]) -> str:
    text = " ".join(_cut(w) for _, w in words[:CHANGED_WORDS])
    return text + (f" …(+{len(words) - CHANGED_WORDS} words)" if len(words) > CHANGED_WORDS else "")


def closest(
    method: str, url: str, body: Any, recorded: list[tuple[str, str | None, Any]]
) -> tuple[int, str] | None:
    """(the index in `recorded` of the closest request, what differs), or None if none was
    recorded. `recorded` holds (method, url, body) as they are matched (redacted, the ignored
    fields removed); a url of None (a production trace's model call: its address unknown, its
    body only the conversation) fits any, and only the fields it holds are compared."""
    if not recorded:
        return None
    best, best_ratio, best_diff = 0, -1.0, None
    for index, (r_method, r_url, r_body) in enumerate(recorded):
        then = words_of(r_body)
        now = words_of(_fields_of(body, r_body) if r_url is None else body)
        matcher = difflib.SequenceMatcher(
            None, [w for _, w in then], [w for _, w in now], autojunk=False
        )
        ratio = matcher.ratio() + (r_method.upper() == method.upper() and r_url in (url, None))
        if ratio > best_ratio:
            best, best_ratio, best_diff = index, ratio, (then, now, matcher)
    r_method, r_url, _ = recorded[best]
    if r_url is not None and (r_method.upper(), r_url) != (method.upper(), url):
        return best, f"in where it was sent: {r_method.upper()} {r_url}"
    assert best_diff is not None
    return best, word_diff(*best_diff)


def _fields_of(body: Any, recorded: Any) -> Any:
    """Of the body sent now, the top-level fields the recorded body has."""
    if isinstance(body, dict) and isinstance(recorded, dict):
        return {key: body[key] for key in recorded if key in body}
    return body


def word_diff(then: list[Word], now: list[Word], matcher: difflib.SequenceMatcher) -> str:
    """`in messages.1.content: "… capital of [-France-] {+Spain+} ?"`, for the first changes."""
    changes = [op for op in matcher.get_opcodes() if op[0] != "equal"]
    if not changes:
        return "the same words, in other fields or another layout"
    shown = []
    for _tag, i1, i2, j1, j2 in changes[:CHANGES_SHOWN]:
        field = now[j1][0] if j1 < len(now) else then[min(i1, len(then) - 1)][0]
        before = [_cut(w) for f, w in now[max(0, j1 - CONTEXT_WORDS) : j1] if f == field]
        after = [_cut(w) for f, w in now[j2 : j2 + CONTEXT_WORDS] if f == field]
        removed, added = _few(then[i1:i2]), _few(now[j1:j2])
        middle = []
        if removed:
            middle.append(f"[-{removed}-]")
        if added:
            middle.append(f"{{+{added}+}}")
        lead = "… " if j1 > CONTEXT_WORDS and now[j1 - CONTEXT_WORDS - 1][0] == field else ""
        tail = " …" if j2 + CONTEXT_WORDS < len(now) and now[j2 + CONTEXT_WORDS][0] == field else ""
        text = " ".join([*before, *middle, *after])
        shown.append(f'in {field}: "{lead}{text}{tail}"')
    more = len(changes) - CHANGES_SHOWN
    return "; ".join(shown) + (f"; and {more} more change(s)" if more > 0 else "")
