"""The per-target measurement resource: one measurement at a time per target.

A measurement (rules ``sweep`` and ``failure_drill``) loads its target; two at once against one
target measure each other's load, not the target's capacity. Every measurement job therefore
takes one unit of a Snakemake resource named after its target, and the Snakefile gives that
resource a limit of 1 (``workflow.global_resources.setdefault``), so no flag is needed locally
or on a cluster executor. The name is derived from the target's identity, never from the
executor or the host, so two invocations agree on it.

What counts as "the same target" (a collision only ever costs parallelism, never correctness,
so the identity errs on the side of merging):

- ``openai`` with a ``base_url``: the server's host and port (the port defaulting by scheme).
  The path, API key and model are ignored: two paths on one host:port are one front end, and
  usually one set of accelerators, so they are serialized. The host is compared as written
  (case aside), never resolved: ``localhost`` and ``127.0.0.1`` are two names for one server,
  so a pack should spell its target the way every other pack measuring it does.
- ``openai`` with ``managed``: the pack's own server process, started by each measurement on
  the job's host (its base_url is replaced by a free loopback port): the pack name.
- ``sim``: the embedded simulated engine, also started by each measurement inside the job: the
  pack name. Two packs' simulators never share a server.

**Isolation** (:func:`local_target`). A target on the pipeline's own host (the simulated engine, a
managed server, a URL on a loopback address) shares its CPUs with every job beside the
measurement: an analysis job running beside a point slows the engine and the client and moves
the measured capacity (measured: a real-engine pack's warm capacity 0.41 RPS against cold 2.8
with ``--cores 2``). A measurement of a local target therefore asks for every core the
invocation has (``threads: workflow.cores``, rules/common.smk ``measure_threads``), so no other
job of this invocation runs beside it whatever ``--cores`` says; what it cannot keep away (other
programs) it measures (:mod:`capacity_pack.measure.host`). A remote target keeps the pipeline
parallel: its jobs do not share the target's CPUs.

Snakemake resources are counted by one invocation's scheduler. Two separate invocations against
one target are serialized by the target lock (:mod:`capacity_pack.measure.lock`, one user on one
host; see docs/cluster.md), whose key is finer for an endpoint (the URL's path counts) and
coarser for local servers (every simulator and managed server of this host is one target).
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
