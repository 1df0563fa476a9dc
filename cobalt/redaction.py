"""One function that makes configuration safe to show: `redact(value)`.

Every door that shows configuration or prints an address goes through it: `/api/config/`, the
MCP config resource, run configurations stored with a run, log lines and error messages that
name a database, broker or webhook URL. It hides

* the value (a whole table too) of every mapping key that names a secret (`api_key`,
  `apiKey`, `secret_key`, `password`, `token`, `auth`, `LANGFUSE_SECRET_KEY`, ...; see
  `is_secret_key`), except keys ending in `_env`, whose value is the *name* of a variable;
* the password of every URL, wherever it appears in a string (`redis://:pw@host`,
  `postgres://user:pw@host`), and the whole user part of an http(s) URL that has no
  password (`https://TOKEN@host`: a token, as GitHub and Sentry put them);
* query-string values whose name is a secret (`?api-key=`, `key`, `token`, `sig`,
  `signature`, `password`, `secret`, `access_token`, `X-Amz-Credential`, ...);
* the path and query of a webhook address (under the key `url`): Slack and Discord put the
  token in the path;
* in any text (a provider's error message, a log line): the `secrets=` given (the API key a
  call used), key-shaped tokens (`sk-…`, `sk-ant-…`, `pk-lf-…`), `Bearer …` / `Basic …`
  credentials and `name=value` or `name: value` whose name ends in a secret word
  (`api_key=…`, `Password: …`, `X-Api-Key: …`).

Hidden values read `***`. Standard library only, on the bottom floor (`cobalt/`): every floor
above imports it from here, `cobalt.config` and `cobalt.evaluator` too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

MASK = "***"

# Words that make a key (of a mapping or of a query string) name a secret. A key is split into
# words at `_`, `-`, `.`, spaces and camelCase humps, so `max_tokens`, `keyword` and `author`
# are not secrets while `api_key`, `apiKey`, `X-Api-Key` and `OPENAI_API_KEY` are.
SECRET_WORDS = frozenset(
    {
        "apikey",
        "auth",
        "authorization",
        "credential",
        "credentials",
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
VARIABLE_NAME_SUFFIX = "env"  # `api_key_env = "MY_KEY"` names a variable: shown as it is

URL_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")
WORD_PATTERN = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
KEY_SHAPED = re.compile(r"\b(?:sk|pk|rk)-[A-Za-z0-9_\-*.]{6,}")
SCHEME_CREDENTIAL = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9_\-.=+/]{6,}")
# `name=value` / `name: value` in text; not a {{placeholder}}, nor what is already hidden.
NAMED_VALUE = re.compile(r"\b([A-Za-z][\w-]*)(\s*[=:]\s*)((?!\{|\*\*\*)[^\s,;'\"&]{6,})")


def redact(value: Any, key: str = "", *, secrets: Iterable[str] = ()) -> Any:
    """`value` with every secret in it replaced by `***`, safe to show or log.

    Mappings and lists are copied, never changed in place. `key` is the name `value` is
    stored under (a mapping's keys are passed down by themselves): a secret-looking name
    hides a non-empty value whole, even a table, and `url` hides a webhook address' path.
    Any string has the passwords and secret query values of the URLs inside it hidden, and
    the credentials of free text (see the module's docstring), so a whole error message can
    be passed too; `secrets` are values known to be secret (a key just used).
    """
    if is_secret_key(key) and value not in (None, "", False, {}, []):
        return MASK
    if isinstance(value, Mapping):
        return {k: redact(v, str(k), secrets=secrets) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v, key, secrets=secrets) for v in value]
    if not isinstance(value, str):
        return value
    if key == "url":
        return URL_PATTERN.sub(lambda m: _host_only(m.group(0)), value)
    for secret in secrets:
        if secret and len(secret) >= 4:
            value = value.replace(secret, MASK)
    value = URL_PATTERN.sub(lambda m: _redact_url(m.group(0)), value)
    value = KEY_SHAPED.sub(MASK, value)
    value = SCHEME_CREDENTIAL.sub(lambda m: f"{m.group(1)} {MASK}", value)
    return NAMED_VALUE.sub(_hide_named_value, value)


def _hide_named_value(match: re.Match[str]) -> str:
    """`api_key=abc123` → `api_key=***`: the last word of the name is a secret word."""
    name, separator, _ = match.groups()
    words = [w.lower() for w in WORD_PATTERN.findall(name)]
    secret = bool(words) and (words[-1] in SECRET_WORDS or "".join(words).endswith("apikey"))
    return f"{name}{separator}{MASK}" if secret else match.group(0)


def is_secret_key(key: str) -> bool:
    """Does this name (of a setting, a header or a query parameter) hold a secret?"""
    words = [w.lower() for w in WORD_PATTERN.findall(key)]
    if not words or words[-1] == VARIABLE_NAME_SUFFIX:
        return False
    joined = "".join(words)
    return any(word in SECRET_WORDS for word in words) or "apikey" in joined


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
        return f"{name}={MASK}" if value and is_secret_key(name) else match.group(0)

    return re.sub(r"(?<=[?&#;])([^=&#;]+)=([^&#;]*)", hide, tail)


def _host_only(url: str) -> str:
    """A webhook address reduced to its scheme, host and port: `https://hooks.slack.com/…`."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{parts.scheme}://{parts.hostname or ''}{f':{port}' if port else ''}/…"
