"""The one place that decides what is secret: `redact(value)` and `environment_secrets(env)`.

Every writer passes what it stores through it (traces, recordings, item errors and
tracebacks, run configurations, evaluations' reasons, logs, webhooks) and every door that
shows configuration or prints an address (`/api/config/`, the MCP config resource, error
messages naming a database, broker or webhook URL). It hides

* **names**: the string values under a mapping key that names a secret — a key split into
  words (at `_`, `-`, `.`, spaces and camelCase humps) holding `key`, `apikey`, `token`,
  `secret`, `password`, `auth`, `authorization`, `cookie`, `signature`, `credential`, ...
  (`api_key`, `apiKey`, `X-Goog-Api-Key`, `openai_api_key`, `client_secret`); under such a
  key every string of a table or list is hidden too. Only strings: `max_tokens`,
  `total_tokens` and `tokens` are not secret names anyway (`tokens` is not `token`), and a
  number or a flag under a secret name (`token_count: 5`) is a count, kept. Keys ending in
  `_env` hold the *name* of a variable and are shown. `keyboard`, `monkey`, `author` are
  single words that are not secret words;
* **URLs**, wherever they appear in a string: the password (`redis://:pw@host`), the whole
  user part of an http(s) URL that has no password (`https://TOKEN@host`), and query values
  whose name is a secret (`?key=`, `api-key`, `x-goog-api-key`, `auth`, `client_secret`,
  `signature`, `sig`, `X-Amz-Credential`, `code`, ...); of a webhook address (`redact(url, "url")`,
  or `url` in a `webhooks` table of the configuration) all but the scheme and host;
* **shapes** in any text: provider keys (`sk-…`, `sk-ant-…`, `pk-lf-…`, `AIza…`), JSON Web
  Tokens (`eyJ….eyJ….…`), `Bearer …` / `Basic …` credentials, and `name=value`,
  `name: value` or `"name": "value"` whose name ends in a secret word (`key=…`,
  `api_key=…`, `Password: …`, `X-Api-Key: …`, `{'token': '…'}`);
* **values**: the `secrets=` given — the API key a call used, and the values of the
  process's secret-looking environment variables (`environment_secrets(os.environ)`, which
  the app reads for its writers: `cobalt_app.storable.redacted`).

Hidden values read `***` (MASK). The rewrites never cut into a JSON escape, so a JSON text
(a recorded response body) stays valid JSON. Standard library only, pure, on the bottom
floor (`cobalt/`): every floor above imports it from here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

MASK = "***"

# Words that make a key (of a mapping, a header or a query string) name a secret.
SECRET_WORDS = frozenset(
    {
        "apikey",
        "auth",
        "authorization",
        "cookie",
        "cookies",
        "credential",
        "credentials",
        "jwt",
        "key",
        "passphrase",
        "passwd",
        "password",
        "pwd",
        "secret",
        "sig",
        "signature",
        "token",
    }
)
# Query parameters that hold a secret in URLs only (`?code=` is an Azure Functions key; a
# `code` argument of a tool is code).
SECRET_QUERY_NAMES = frozenset({"code"})
VARIABLE_NAME_SUFFIX = "env"  # `api_key_env = "MY_KEY"` names a variable: shown as it is
# An environment variable's value shorter than this is not taken for a secret (`1`, `true`),
# nor a file's path (`PWD`: `pwd` is a password's word; `SSH_AUTH_SOCK`, `XAUTHORITY`): hiding
# those would hide the project's folder in every traceback.
MIN_ENV_SECRET = 8
FILE_PATH = re.compile(r"(?:~|\.{0,2})/[\w.@+-]+(?:/[\w.@+-]*)*")

URL_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
WORD_PATTERN = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
KEY_SHAPED = re.compile(
    r"\b(?:sk|pk|rk)-[A-Za-z0-9_\-*.]{6,}"  # OpenAI, Anthropic (sk-ant-…), Langfuse (pk-lf-…)
    r"|\bAIza[0-9A-Za-z_-]{20,}"  # Google
    r"|\beyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"  # a JSON Web Token
)
# `Bearer <token>`; `Basic <base64>` only with a digit in it: `basic arithmetic` is not one.
SCHEME_CREDENTIAL = re.compile(r"(?i)\b(bearer\s+|basic\s+(?=[A-Za-z_\-.=+/~]*\d))[\w\-.=+/~]{6,}")
# `name=value` / `name: value` in text: a name and its separator, then the value at its end
# (not a {{placeholder}}, nor what is already hidden). Found apart so that the value of one
# pair cannot swallow the next (`failed: key=abc`).
NAME_SEPARATOR = re.compile(r"\b([A-Za-z][\w-]*)(\s*[=:]\s*)")
NAMED_VALUE = re.compile(r"(?!\{|\*\*\*)[^\s,;'\"&\\]{3,}")
# `"name": "value"` in a JSON text or a repr, the value's own escapes included (`"a\"b"`)...
QUOTED_VALUE = re.compile(r"""(["'])([A-Za-z][\w.-]*)\1(\s*:\s*)(["'])((?:(?!\4)[^\\\n]|\\.)+)\4""")
# ... and in JSON inside a JSON string (`\"name\": \"value\"`), whose escaped quote is `\\\"`.
ESCAPED_QUOTED_VALUE = re.compile(
    r'(\\")([A-Za-z][\w.-]*)\\"(\s*:\s*)(\\")((?:\\\\\\"|\\\\\\\\|\\\\[^\\"\n]|[^"\\\n])+?)\\"'
)
# Case-folded pieces one of which every text with something to hide holds: the others are
# returned as they are without running the patterns (most of a trace's texts). A piece that
# holds another (`sign` holds `sig`) is left out: one scan of the text per piece.
_PIECES = [*(w[:4] for w in SECRET_WORDS), "://", "k-", "aiza", "eyj", "bearer", "basic"]
HINTS = tuple(sorted({p for p in _PIECES if not any(o != p and o in p for o in _PIECES)}))


def _by_first_letter(pieces: Iterable[str]) -> str:
    """`a(?:iza|pik)|b(?:asic|earer)|...`: an alternation tried letter by letter, which Python's
    `re` runs twice as fast as the flat one (each position tries one branch, not all 17)."""
    groups: dict[str, list[str]] = {}
    for piece in sorted(pieces):
        groups.setdefault(piece[0], []).append(re.escape(piece[1:]))
    return "|".join(
        re.escape(first) + (rests[0] if len(rests) == 1 else f"(?:{'|'.join(rests)})")
        for first, rests in groups.items()
    )


# Every stored text is scanned for them (a trace holds dozens per item): one regular
# expression is quicker on a short text, one substring search per piece on a long one.
HINT_PATTERN = re.compile(_by_first_letter(HINTS))
SHORT_TEXT = 160

HOOK_KEYS = ("url", "webhooks")  # a webhook address: given alone, or in the configuration


def redact(value: Any, key: str = "", *, secrets: Iterable[str] = ()) -> Any:
    """`value` with every secret in it replaced by `***`, safe to store, show or log.

    Mappings and lists are copied (as dicts and lists), never changed in place. `key` is the
    name `value` is stored under (a mapping's keys are passed down by themselves): a secret
    name hides every non-empty string of the value; `url` hides a webhook address' path.
    Any string has the URLs, key shapes and named credentials inside it hidden (see the
    module's docstring), so a whole error message or log line can be passed; `secrets` are
    values known to be secret (a key just used, the environment's secret values).
    """
    known = tuple(s for s in secrets if s and len(s) >= 4)
    return _redact(value, key, known, is_secret_key(key), key in HOOK_KEYS)


def _redact(value: Any, key: str, secrets: tuple[str, ...], hidden: bool, hook: bool) -> Any:
    if isinstance(value, str):
        if hidden and value:
            return MASK
        if hook and key == "url":
            return URL_PATTERN.sub(lambda m: _host_only(m.group(0)), value)
        return redact_text(value, secrets)
    if isinstance(value, Mapping):
        return {
            k: _redact(v, str(k), secrets, hidden or is_secret_key(str(k)), hook or k == "webhooks")
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_redact(v, key, secrets, hidden, hook) for v in value]
    return value


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """One text with the given secret values, URLs' credentials, key shapes and named
    credentials hidden."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    if not may_hold(text):
        return text
    if "://" in text:
        text = URL_PATTERN.sub(lambda m: _redact_url(m.group(0)), text)
    text = KEY_SHAPED.sub(MASK, text)
    text = SCHEME_CREDENTIAL.sub(lambda m: f"{m.group(1).rstrip()} {MASK}", text)
    text = QUOTED_VALUE.sub(_hide_quoted_value, text)
    text = ESCAPED_QUOTED_VALUE.sub(_hide_quoted_value, text)
    return _hide_named_values(text)


def may_hold(text: str, secrets: Iterable[str] = ()) -> bool:
    """Whether a text may hold something to hide: without, it is kept as it is (most are)."""
    if len(text) < SHORT_TEXT:
        hinted = HINT_PATTERN.search(text.casefold()) is not None
    else:
        hinted = any(map(_hinted_window, _windows(text)))
    return hinted or any(s and s in text for s in secrets)


# A long text is scanned in windows of WINDOW characters, each overlapping the next by a
# hint's length less one (a hint across two windows is whole in one: case folding maps each
# character on its own, to one or more), and what each window holds is remembered: texts
# that begin alike (every model call's input starts with the same system prompt) are folded
# and scanned once for their common windows, not once per hint per text.
WINDOW = 256
_OVERLAP = max(map(len, HINTS)) - 1
_WINDOWS_MAX = 8192  # windows remembered; forgotten all at once
_seen_windows: dict[str, bool] = {}


def _windows(text: str) -> Iterator[str]:
    for start in range(0, len(text) - _OVERLAP, WINDOW):
        yield text[start : start + WINDOW + _OVERLAP]


def _hinted_window(window: str) -> bool:
    known = _seen_windows.get(window)
    if known is None:
        folded = window.casefold()
        known = any(hint in folded for hint in HINTS)
        if len(_seen_windows) >= _WINDOWS_MAX:
            _seen_windows.clear()
        _seen_windows[window] = known
    return known


def environment_secrets(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The values of an environment's secret-looking variables (`OPENAI_API_KEY`,
    `GITHUB_TOKEN`, `DB_PASSWORD`, ...), longest first, so that one containing another is
    hidden whole; values shorter than MIN_ENV_SECRET characters and file paths are not."""
    values = {
        value
        for name, value in environ.items()
        if len(value) >= MIN_ENV_SECRET
        and value != MASK
        and not FILE_PATH.fullmatch(value)
        and is_secret_key(name)
    }
    return tuple(sorted(values, key=lambda v: (-len(v), v)))


def _names_secret(name: str) -> bool:
    """The last word of a name in text is a secret word (`api_key`, `X-Api-Key`)."""
    words = [w.lower() for w in WORD_PATTERN.findall(name)]
    return bool(words) and (words[-1] in SECRET_WORDS or "".join(words).endswith("apikey"))


def _hide_named_values(text: str) -> str:
    """`api_key=abc123` → `api_key=***`, `Password: x` → `Password: ***`."""
    parts, done = [], 0
    for pair in NAME_SEPARATOR.finditer(text):
        if pair.start() < done or not _names_secret(pair.group(1)):
            continue
        value = NAMED_VALUE.match(text, pair.end())
        if value:
            parts += [text[done : pair.end()], MASK]
            done = value.end()
    return "".join([*parts, text[done:]]) if parts else text


def _hide_quoted_value(match: re.Match[str]) -> str:
    """`"token": "abc"` → `"token": "***"`."""
    quote, name, separator, value_quote, value = match.groups()
    if value == MASK or not _names_secret(name):
        return match.group(0)
    return f"{quote}{name}{quote}{separator}{value_quote}{MASK}{value_quote}"


def is_secret_query(name: str) -> bool:
    """Does this query parameter of a URL hold a secret?"""
    return name.lower() in SECRET_QUERY_NAMES or is_secret_key(name)


def is_secret_key(key: str) -> bool:
    """Does this name (of a setting, a header or a query parameter) hold a secret?"""
    words = [w.lower() for w in WORD_PATTERN.findall(key)]
    if not words or words[-1] == VARIABLE_NAME_SUFFIX:
        return False
    return any(word in SECRET_WORDS for word in words) or "apikey" in "".join(words)


def _redact_url(url: str) -> str:
    scheme, rest = url.split("://", 1)
    authority, tail = _split_authority(rest)
    if "@" in authority:
        userinfo, host = authority.rsplit("@", 1)
        user, colon, _password = userinfo.partition(":")
        if colon:
            userinfo = f"{user}:{MASK}"
        elif scheme.lower() in ("http", "https"):
            userinfo = MASK
        authority = f"{userinfo}@{host}"
    return f"{scheme}://{authority}{_redact_query(tail)}"


def _split_authority(rest: str) -> tuple[str, str]:
    """`user:pw@host:6379` and what follows it (from its `/`, `?` or `#` on).

    As URL parsers do, the authority ends at the first `/`, `?` or `#`, and the user part at
    its last `@`. A password written with a raw `/`, `?` or `#` (`redis://:a/b@host`) would
    end it early and show: when the text before the first `@` has a `:`, that whole text is
    taken as the user part (hiding too much rather than too little).
    """
    end = next((i for i, c in enumerate(rest) if c in "/?#"), len(rest))
    at, colon = rest.find("@"), rest.find(":")
    port = rest[colon + 1 : end].isdigit()  # `host:8080/users/@me` is a path
    if "@" not in rest[:end] and at > end and 0 <= colon < end and not port:
        end = next((i for i, c in enumerate(rest) if c in "/?#" and i > at), len(rest))
    return rest[:end], rest[end:]


def _redact_query(tail: str) -> str:
    """The path, query and fragment with each secret `name=value` hidden."""

    def hide(match: re.Match[str]) -> str:
        name, value = match.group(1), match.group(2)
        return f"{name}={MASK}" if value and is_secret_query(name) else match.group(0)

    return re.sub(r"(?<=[?&#;])([^=&#;]+)=([^&#;\\]*)", hide, tail)


def _host_only(url: str) -> str:
    """A webhook address reduced to its scheme, host and port: `https://hooks.slack.com/…`."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{parts.scheme}://{parts.hostname or ''}{f':{port}' if port else ''}/…"
