"""HTTP settings shared by everything that talks to a target: TLS verification, the bearer
header, which header values are credentials, and the redaction of a server's JSON answers.

- :func:`verify_setting` turns ``tls_verify``/``ca_bundle`` into httpx's ``verify``: False, the
  system CAs (True), or an SSL context over a private CA bundle.
- :func:`header_secrets` lists the credentials a header set carries (the ``Authorization``
  value and its token, any secret-named header), so that every message quoting a server can
  hide them.
- :func:`redact_json` replaces secret-named fields (SGLang's server args carry the server's own
  ``api_key``) and secret values anywhere in a JSON answer by ``[redacted]``.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping, Sequence
from typing import Any

from capacity_pack.redact import looks_secret, redact_text

REDACTED = "[redacted]"


def verify_setting(tls_verify: bool = True, ca_bundle: str | None = None) -> bool | ssl.SSLContext:
    """httpx's ``verify`` for a target: False, the system CAs (True), or a private CA bundle."""
    if not tls_verify:
        return False
    if ca_bundle is not None:
        return ssl.create_default_context(cafile=ca_bundle)
    return True


def auth_headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def header_secrets(headers: Mapping[str, str] | None) -> list[str]:
    """The credentials carried by ``headers`` (a bearer token, any secret-named header)."""
    out = []
    for name, value in (headers or {}).items():
        if name.lower() == "authorization" or looks_secret(name):
            out.append(value)
            scheme, _, token = value.partition(" ")
            if token and scheme.lower() in ("bearer", "basic", "token"):
                out.append(token)
    return out


def redact_json(obj: Any, secrets: Sequence[str]) -> Any:
    """``obj`` with secret-named fields and secret values replaced."""
    if isinstance(obj, Mapping):
        out = {}
        for key, value in obj.items():
            hidden = looks_secret(str(key)) and value not in (None, "", False)
            out[str(key)] = REDACTED if hidden else redact_json(value, secrets)
        return out
    if isinstance(obj, list):
        return [redact_json(v, secrets) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj, list(secrets))
    return obj
