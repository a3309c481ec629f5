"""Secrets: which keys name one, which values are one, and text with them replaced.

A key names a secret when one of its words is a secret word (password, authorization, ...), two
consecutive words form a secret pair (api key, access key, ...), or ``token`` is its last word
or follows a qualifier (``hf_token``, ``access_token_value``); ``input_tokens`` and
``time_to_first_token_ms`` do not.

Secret values are read at each call from the environment: variables named ``*_KEY``,
``*_TOKEN``, ``*_SECRET``, ``*_PASSWORD`` (``MLFLOW_TRACKING_PASSWORD``,
``MLFLOW_TRACKING_TOKEN``...) and ``PGPASSWORD``; the password in the userinfo of
``MLFLOW_TRACKING_URI`` and of any other ``*_URI`` or ``*_URL`` variable (as written and
percent-decoded); the variable a target's ``api_key_env`` names, given by the caller or
registered for the whole process with :func:`watch_env` (the manifest does so when it validates
a target, so every log line of a job knows the key, whatever its variable's name). A secret of
8 characters or more is replaced wherever it appears; a shorter one only when it is the whole
text (containment would drop "10" for a secret "1").

Whatever the environment, :func:`redact_text` also replaces the password of every URL written
with one (``scheme://user:PASSWORD@host``, RFC 3986 userinfo), however short: a URL is where a
password shows up in an error message (MLflow's "API request to http://user:pw@host/... failed").

Every sink that writes what a server, a child process or the environment said (engine probes,
target and server logs, command output, job logs, the console, MLflow) redacts through this
module, which imports nothing of the project.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

TRACKING_URI_ENV = "MLFLOW_TRACKING_URI"

# fmt: off
# Words that make a key a secret wherever they appear in it.
_SECRET_WORDS = frozenset({
    "secret", "secrets", "password", "passwd", "passphrase", "pwd", "authorization",
    "credential", "credentials", "cookie", "bearer", "apikey", "jwt", "privatekey",
})
# Word pairs that do (api_key, access_key...), where each word alone does not.
_SECRET_PAIRS = frozenset({
    ("api", "key"), ("access", "key"), ("private", "key"), ("signing", "key"),
    ("encryption", "key"), ("session", "key"), ("auth", "header"), ("client", "secret"),
})
# "token" counts tokens far more often than it authenticates (input_tokens, tokenizer,
# time_to_first_token_ms): it marks a secret only as the key's last word (hf_token, token) or
# right after one of these words (access_token_value).
_TOKEN_QUALIFIERS = frozenset({
    "access", "auth", "api", "bearer", "refresh", "id", "session", "hf", "github", "gh",
    "gitlab", "oauth", "personal", "secret", "csrf", "slack",
})
# fmt: on
_SECRET_ENV_SUFFIXES = ("_KEY", "_TOKEN", "_SECRET", "_PASSWORD")
# libpq reads a database password from here, so a store URI can leave it out.
_SECRET_ENV_NAMES = frozenset({"PGPASSWORD"})
# Variables that hold a URI, whose userinfo may carry a password (a store or server URI).
_URI_ENV_SUFFIXES = ("_URI", "_URL")
# scheme://user:password@: the user name ends at the first ":", the password at the last "@"
# before the path (as urllib.parse reads it, so an unencoded "@" in a password is covered too).
# The user name stays readable: it names an identity, it is no credential.
_URL_PASSWORD = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:\[\]]*):(?P<password>[^\s/?#\[\]]+)@"
)
# Variables (a target's api_key_env) whose value is a secret whatever their name.
_WATCHED_ENV: set[str] = set()
REDACTION = "[redacted]"
# Shorter secrets are matched by equality only: containment would drop "10" for a secret "1".
MIN_CONTAINED_SECRET = 8


def _words(key: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", key)  # apiKey -> api Key
    return [w for w in re.split(r"[^a-z0-9]+", spaced.lower()) if w]


def looks_secret(key: str) -> bool:
    """Whether a param or tag key names a secret (api_key, HF_TOKEN, Authorization...)."""
    words = _words(key)
    if any(w in _SECRET_WORDS for w in words):
        return True
    if any(pair in _SECRET_PAIRS for pair in zip(words, words[1:], strict=False)):
        return True
    return any(
        w == "token" and (i == len(words) - 1 or (i > 0 and words[i - 1] in _TOKEN_QUALIFIERS))
        for i, w in enumerate(words)
    )


def watch_env(name: str | None) -> None:
    """Count the value of variable ``name`` as a secret from now on in this process (a target's
    ``api_key_env``: its name need not look secret). The value is still read at each call."""
    if name:
        _WATCHED_ENV.add(name)


def uri_password(uri: str) -> list[str]:
    """The password in ``uri``'s userinfo, as written and percent-decoded (none: [])."""
    try:
        password = urlsplit(uri).password
    except ValueError:  # a malformed URI fails where it is used, not here
        return []
    return list(dict.fromkeys([password, unquote(password)])) if password else []


def manifest_secret_values(frozen: Mapping[str, Any] | None = None) -> list[str]:
    """Values of environment variables named like secrets, the passwords in URI variables
    (the tracking URI among them), the watched variables (:func:`watch_env`) and the API key of
    the frozen manifest's target (its ``api_key_env`` may have any name), read at each call."""
    out = []
    for name, value in os.environ.items():
        upper = name.upper()
        if not value:
            continue
        if (
            upper in _SECRET_ENV_NAMES
            or name in _WATCHED_ENV
            or any(upper.endswith(s) or upper == s[1:] for s in _SECRET_ENV_SUFFIXES)
        ):
            out.append(value)
        elif upper.endswith(_URI_ENV_SUFFIXES):  # MLFLOW_TRACKING_URI among them
            out.extend(uri_password(value))
    target = ((frozen or {}).get("manifest") or {}).get("target") or {}
    key_env = target.get("api_key_env") if isinstance(target, Mapping) else None
    if isinstance(key_env, str) and os.environ.get(key_env):
        out.append(os.environ[key_env])
    return out


def secret_values(api_key_env: str | None = None) -> list[str]:
    """The secrets to keep out of logs and files: environment variables named like secrets and
    the API key held by ``api_key_env``."""
    target = {"api_key_env": api_key_env} if api_key_env else {}
    return manifest_secret_values({"manifest": {"target": target}})


def redact_text(text: str, secrets: Sequence[str] | None = None) -> str:
    """``text`` with every secret replaced by ``[redacted]`` (default secrets:
    :func:`secret_values`), a secret under 8 characters only when it is the whole text, and the
    password of every ``scheme://user:password@`` URL in it, whatever its length."""
    values = secret_values() if secrets is None else secrets
    # Longest first, so a secret that contains another is replaced whole.
    for secret in sorted({v for v in values if v}, key=len, reverse=True):
        if text == secret:
            return REDACTION
        if len(secret) >= MIN_CONTAINED_SECRET:
            text = text.replace(secret, REDACTION)
    if "://" in text:
        text = _URL_PASSWORD.sub(rf"\g<head>:{REDACTION}@", text)
    return text


def holds_secret(text: str, secrets: list[str]) -> bool:
    """Whether ``text`` is, or contains, one of ``secrets`` (containment only from 8 characters)."""
    return any(text == s or (len(s) >= MIN_CONTAINED_SECRET and s in text) for s in secrets)
