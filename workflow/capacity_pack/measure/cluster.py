"""The per-target measurement resource: one measurement at a time per target.

Every measurement job (rules ``sweep`` and ``failure_drill``) takes one unit of a Snakemake
resource named after its target's identity (:func:`target_resource`: an endpoint's host and
port; a managed or simulated target's pack name), limited to 1 by the Snakefile; a local target
(:func:`is_local`) asks for every core. Across invocations: :mod:`capacity_pack.measure.lock`.
Method: docs/cluster.md, 'One measurement at a time per target'.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from capacity_pack.plan.manifest import Pack

RESOURCE_PREFIX = "target_"
# The resource's name before issue 10: one global slot for whatever target the pack had. It
# still matches RESOURCE_PATTERN, so old Snakemake logs keep their gates in the autopsy.
LEGACY_RESOURCE = "target_slot"
# A held per-target resource in a logged `resources:` line ("tmpdir=/tmp, target_x=1").
RESOURCE_PATTERN = re.compile(rf"\b({RESOURCE_PREFIX}[a-z0-9_]+)=[1-9][0-9]*\b")
# Snakemake prints every resource on each job line, and a host name may be up to 253 characters.
MAX_NAME_LENGTH = 64
_DEFAULT_PORTS = {"http": 80, "https": 443}


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9_]", "_", text.lower())


def target_identity(pack: Pack) -> str:
    """The target's identity as ``kind:...`` text (see the module docstring)."""
    target = pack.target
    if target.kind == "sim":
        return f"sim:{pack.pack.name}"
    if target.managed is not None:
        return f"managed:{pack.pack.name}"
    url = urlsplit(target.base_url)
    port = url.port or _DEFAULT_PORTS[url.scheme.lower()]
    host = url.hostname or ""
    return f"openai:[{host}]:{port}" if ":" in host else f"openai:{host}:{port}"


def target_resource(pack: Pack) -> str:
    """The Snakemake resource a measurement of ``pack`` holds: ``target_<slug>``.

    A valid Python identifier (Snakemake resource names are), deterministic, and at most
    ``MAX_NAME_LENGTH`` characters: a longer slug is cut and suffixed with a hash of the whole
    identity, so two long host names still get two names.
    """
    kind, _, rest = target_identity(pack).partition(":")
    slug = _slug(rest if kind == "openai" else f"{kind}_{rest}")
    name = RESOURCE_PREFIX + slug
    if len(name) > MAX_NAME_LENGTH:
        digest = hashlib.sha256(target_identity(pack).encode()).hexdigest()[:12]
        name = f"{name[: MAX_NAME_LENGTH - len(digest) - 1]}_{digest}"
    return name


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def local_target(pack: Pack) -> bool:
    """Whether the pack's target runs on the pipeline's host (:func:`is_local`)."""
    return is_local(pack.target)


def is_local(target: Any) -> bool:
    """Whether ``target`` runs on this host: a simulated engine, a managed server, or a URL on
    a loopback address (``127.0.0.0/8``, ``localhost``, ``::1``)."""
    if target.kind == "sim" or target.managed is not None:
        return True
    host = (urlsplit(target.base_url).hostname or "").lower()
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def held_target_resources(resources: str) -> list[str]:
    """The per-target resources (a legacy ``target_slot`` too) held in a logged resources line."""
    return RESOURCE_PATTERN.findall(resources)
