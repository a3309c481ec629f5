"""The system under test: start the simulated engine, or reach, identify and reset a real one.

``sim`` targets: :class:`SimProcess` starts ``sim serve`` or ``sim cluster`` on a free loopback
port per point and stops it when the point ends. ``openai`` targets: one :class:`Endpoint` per
point, the engine identified and checked against the manifest before it
(:class:`TargetError` under ``identity_check: enforce``), and a cold point's cache reset
(``target.cache_reset``: the restart command or the engine's registered reset). Either way
:func:`verify_cold` requires an idle engine with no KV blocks in use and records the
prefix-cache counters it starts from; ``cache_empty_verified`` is true only on evidence.
Method: docs/packs.md, 'The target of a point, a cold reset and its check'.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from capacity_pack import engines
from capacity_pack.errors import StatedError
from capacity_pack.measure.commands import CommandError, check, redact_output, run_command
from capacity_pack.plan.system import Engine, OpenAITarget, SimTarget
from capacity_pack.redact import redact_text

log = logging.getLogger("capacity_pack.measure.target")


class TargetError(StatedError, RuntimeError):
    """The target could not be started, reached or reset."""


class SimProcess:
    """A simulated engine (or cluster) for one pack target, on a free port of 127.0.0.1.

    A thin adapter over :class:`capacity_pack.sim.process.SimProcess` (which also makes the
    child die with this process, so an interrupted measurement leaves no server behind).
    ``control_headers`` carries the child's control-plane token (faults, stalls, kills; see
    :mod:`capacity_pack.sim.control`); the OpenAI routes and ``/reset_prefix_cache`` need none.
    """

    def __init__(
        self,
        target: SimTarget,
        model_name: str,
        *,
        ground_truth: str | Path | None = None,
        log_path: str | Path | None = None,
        extra_args: list[str] | None = None,
        startup_timeout_s: float = 60.0,
    ):
        self.target = target
        self.model_name = model_name
        self.ground_truth = Path(ground_truth) if ground_truth else None
        self.log_path = Path(log_path) if log_path else None
        self.extra_args = extra_args or []
        self.startup_timeout_s = startup_timeout_s
        self._proc = None
        self.base_url = ""

    def start(self) -> str:
        from capacity_pack.sim.process import SimProcess as ChildProcess

        args = ["--profile", self.target.profile, "--model-name", self.model_name]
        command = "serve"
        if self.target.replicas > 1:
            command = "cluster"
            args += ["--replicas", str(self.target.replicas), "--router", self.target.router]
        if self.ground_truth is not None:
            self.ground_truth.parent.mkdir(parents=True, exist_ok=True)
            args += ["--ground-truth", str(self.ground_truth.resolve())]
        self._proc = ChildProcess(
            *args, *self.extra_args, command=command, startup_timeout_s=self.startup_timeout_s
        )
        try:
            self._proc.start()
        except RuntimeError as err:
            self.stop()
            raise TargetError(redact_output(str(err))) from None
        self.base_url = self._proc.url
        deadline = time.monotonic() + self.startup_timeout_s
        while not healthy(self.base_url):
            if time.monotonic() > deadline:
                self.stop()
                raise TargetError(f"simulated engine not healthy within {self.startup_timeout_s} s")
            time.sleep(0.05)
        return self.base_url

    @property
    def control_headers(self) -> dict[str, str]:
        if self._proc is None:
            raise TargetError("the simulated engine is not started")
        return self._proc.control_headers

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.close_keeping_log(self.log_path, redact_output)
        self._proc = None

    def __enter__(self) -> SimProcess:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def healthy(base_url: str, timeout_s: float = 1.0) -> bool:
    """Whether `GET {base_url}/health` answers 200 within ``timeout_s``."""
    import httpx

    try:
        return httpx.get(f"{base_url}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Scrape:
    """Canonical signals of one ``/metrics`` read, and what it could not show."""

    values: dict[str, float]
    missing: list[str] = field(default_factory=list)


class Endpoint:
    """A real target's HTTP side for one point: one client (API key, TLS verification), the
    engine's metric map and where its Prometheus text lives.

    Without a map (a simulated engine, an unknown one) signals are read under every name a
    registered engine gives them (:func:`capacity_pack.engines.parse_metrics`).
    """

    def __init__(
        self,
        base_url: str,
        *,
        headers: dict[str, str] | None = None,
        verify: Any = True,
        secrets: Sequence[str] = (),
    ):
        import httpx

        self.base_url = base_url.rstrip("/")
        self.headers = dict(headers or {})
        self.verify = verify
        self.secrets = [s for s in (*secrets, *engines.header_secrets(headers)) if s]
        self.client = httpx.Client(headers=self.headers, verify=verify, timeout=30.0)
        self.map_name: str | None = None
        self.emap: Any = None
        self.metrics_path = "/metrics"

    @classmethod
    def for_target(cls, target: OpenAITarget, base_url: str) -> Endpoint:
        key = os.environ.get(target.api_key_env, "") if target.api_key_env else ""
        return cls(
            base_url,
            headers=engines.auth_headers(key),
            verify=engines.verify_setting(target.tls_verify, target.ca_bundle),
            secrets=[key] if key else [],
        )

    def use_metric_map(self, name: str | None) -> None:
        """Read signals through ``name``'s map (a kind or engine name); None: every known name."""
        self.emap = engines.metric_map(name)
        self.map_name = name if self.emap is not None else None
        self.metrics_path = engines.metrics_path(engines.engine_kind(name))

    def redact(self, text: str) -> str:
        return redact_text(text, self.secrets)

    def get(self, path: str, timeout_s: float = 5.0) -> Any:
        return self.client.get(f"{self.base_url}{path}", timeout=timeout_s)

    def post(self, path: str, timeout_s: float = 30.0) -> Any:
        return self.client.post(f"{self.base_url}{path}", timeout=timeout_s)

    def wait_idle(self, timeout_s: float) -> dict[str, float]:
        return wait_idle(self.base_url, timeout_s=timeout_s, endpoint=self)

    def healthy(self, timeout_s: float = 1.0) -> bool:
        import httpx

        try:
            return self.get("/health", timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def scrape(self, timeout_s: float = 5.0) -> Scrape:
        import httpx

        url = f"{self.base_url}{self.metrics_path}"
        try:
            resp = self.get(self.metrics_path, timeout_s)
        except httpx.HTTPError as exc:
            return Scrape({}, [self.redact(f"metrics: GET {url} failed: {type(exc).__name__}")])
        if resp.status_code != 200:
            return Scrape({}, [f"metrics: GET {url} answered {resp.status_code}"])
        if self.emap is None:
            values = engines.parse_metrics(resp.text)
            missing = [
                f"{signal}: no known series for it on {url}"
                for signal in ("queue_depth", "running", "kv_usage")
                if signal not in values
            ]
            return Scrape(values, missing)
        values, missing = engines.read_signals(
            resp.text, self.emap, map_name=self.map_name or "?", url=url
        )
        return Scrape(values, missing)

    def close(self) -> None:
        self.client.close()


@contextlib.contextmanager
def _endpoint(base_url: str, endpoint: Endpoint | None) -> Iterator[Endpoint]:
    if endpoint is not None:
        yield endpoint
        return
    own = Endpoint(base_url)
    try:
        yield own
    finally:
        own.close()


def reset_prefix_cache(
    target: OpenAITarget,
    base_url: str,
    *,
    timeout_s: float = 120.0,
    endpoint: Endpoint | None = None,
    total_slots: int | None = None,
) -> str:
    """Clear a real engine's prefix cache for a cold point; returns what was done."""
    with _endpoint(base_url, endpoint) as ep:
        return _reset(target, ep, timeout_s, total_slots)


def _reset(target: OpenAITarget, ep: Endpoint, timeout_s: float, total_slots: int | None) -> str:
    if target.cache_reset == "none":
        return "none"
    if target.cache_reset == "restart":
        assert target.restart_command is not None
        try:
            done = run_command(
                target.restart_command,
                timeout_s=target.restart_timeout_s,
                what="target.restart_command",
                secrets=ep.secrets,
            )
            check(done, "target.restart_command")
        except CommandError as err:
            raise TargetError(str(err)) from None
        deadline = time.monotonic() + timeout_s
        while not ep.healthy():
            if time.monotonic() > deadline:
                raise TargetError(f"{ep.base_url} not healthy {timeout_s} s after the restart")
            time.sleep(0.5)
        return "restart"
    reset = engines.cache_reset(target.cache_reset)
    if reset is None:
        raise TargetError(engines.check_cache_reset(target) or target.cache_reset)
    try:
        return reset.perform(ep, timeout_s, total_slots)
    except engines.ResetError as err:
        raise TargetError(str(err)) from None


def cold_evidence(
    ep: Endpoint, identity: engines.EngineIdentity, target: OpenAITarget, engine: Engine | None
) -> dict[str, Any] | None:
    """The engine module's own evidence of an empty cache, where it has one (llama.cpp's
    slots): the answering engine's, else that of the engine whose reset the target names."""
    for spec in (engines.get(identity.kind), engines.reset_owner(target.cache_reset)):
        if spec is not None and spec.cold_evidence is not None:
            config = engine.config if engine is not None else {}
            try:
                return spec.cold_evidence(ep, identity.total_slots, config)
            except engines.ResetError as err:
                raise TargetError(str(err)) from None
    return None


def wait_idle(
    base_url: str, *, timeout_s: float = 60.0, endpoint: Endpoint | None = None
) -> dict[str, float]:
    """Wait until nothing runs or waits (the metrics say so); return the last scrape's values.

    When the engine does not show both counts the wait cannot be judged and returns at once
    (:func:`verify_cold` then says the idle state is unknown).
    """
    with _endpoint(base_url, endpoint) as ep:
        return _wait_idle(ep, timeout_s).values


def _wait_idle(ep: Endpoint, timeout_s: float) -> Scrape:
    deadline = time.monotonic() + timeout_s
    while True:
        m = ep.scrape()
        if "running" not in m.values or "queue_depth" not in m.values:
            return m
        if m.values["running"] == 0 and m.values["queue_depth"] == 0:
            return m
        if time.monotonic() > deadline:
            raise TargetError(f"{ep.base_url} still busy after {timeout_s} s: {m.values}")
        time.sleep(0.2)


def verify_cold(
    base_url: str,
    *,
    endpoint: Endpoint | None = None,
    slot_evidence: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Check the engine is idle with no KV blocks in use; the counters the point starts from.

    ``slot_evidence`` (an engine module's ``cold_evidence``, :func:`cold_evidence`) stands in
    for a KV-usage gauge the engine lacks, and adds its own conditions.
    """
    with _endpoint(base_url, endpoint) as ep:
        m = _wait_idle(ep, 60.0)
    v = m.values
    kv = v.get("kv_usage")
    reasons = []
    if "running" not in v or "queue_depth" not in v:
        reasons.append("the engine's metrics do not show that nothing runs or waits")
    if kv is not None and kv > 1e-9:
        reasons.append(f"KV usage is {kv:g} at the start")
    if slot_evidence is not None:
        reasons += slot_evidence["reasons"]
    elif kv is None:
        reasons.append("no KV-usage series to show the cache is empty")
    facts: dict[str, Any] = {
        "cache_empty_verified": not reasons,
        "kv_usage_at_start": kv,
        "prefix_cache_hits_at_start": v.get("prefix_cache_hits"),
        "prefix_cache_queries_at_start": v.get("prefix_cache_queries"),
        "metric_map": ep.map_name,
        "missing_evidence": m.missing,
    }
    if "prefix_cache_hit_rate" in v:
        facts["prefix_cache_hit_rate_at_start"] = v["prefix_cache_hit_rate"]
    if slot_evidence is not None:
        facts["slot_evidence"] = {k: val for k, val in slot_evidence.items() if k != "reasons"}
    if reasons:
        facts["cache_empty_reason"] = "; ".join(reasons)
    return facts


def identify(
    target: OpenAITarget, ep: Endpoint, expected: Any, facts: dict[str, Any]
) -> engines.EngineIdentity:
    """Probe the engine, compare it with the manifest, put both in ``facts``; raise on a
    mismatch under ``identity_check: enforce``."""
    identity = engines.probe_engine(ep.base_url, ep.headers, 5.0, verify=ep.verify)
    if not identity.reachable:
        raise TargetError(
            f"{engines.unreachable(identity)}: start it, or set target.base_url to where it "
            "listens (capacity-pack init --url URL probes a server and writes a pack for it)"
        )
    facts["engine_identity"] = identity.model_dump(mode="json")
    problems: list[str] = []
    if target.identity_check != "off":
        problems = engines.check_identity(identity, expected, secrets=ep.secrets)
    facts["identity_mismatches"] = problems
    if problems and target.identity_check == "enforce":
        listed = "\n  - ".join(problems)
        raise TargetError(
            f"the server at {ep.base_url} is not what the manifest froze (target.identity_check "
            f"'enforce'; 'warn' would measure anyway):\n  - {listed}"
        )
    for problem in problems:
        log.warning("identity mismatch (target.identity_check 'warn'): %s", problem)
    return identity


def _expected(target: OpenAITarget, model: str, expected: Any) -> Any:
    if expected is not None:
        return expected
    # Only the served name is known: the engine is not compared.
    named = SimpleNamespace(served_name=model, id=model, revision="")
    return SimpleNamespace(engine=None, model=named, target=target)


def _managed(
    target: OpenAITarget, model: str, cache_state: str, *, log_path: Any, expected: Any
) -> Iterator[tuple[str, dict[str, Any]]]:
    """A fresh managed server for the point, then the openai path against it."""
    from capacity_pack.measure.managed import ManagedError, ManagedServer, prepare

    m = target.managed
    assert m is not None
    try:
        server = ManagedServer(
            m.command,
            prepared=prepare(m.prepare, timeout_s=m.prepare_timeout_s),
            ready_path=m.ready_path,
            startup_timeout_s=m.startup_timeout_s,
            env=m.env,
            log_path=log_path,
        )
        server.start()
    except ManagedError as err:
        raise TargetError(str(err)) from None
    try:
        inner = target.model_copy(update={"base_url": server.base_url, "managed": None})
        with open_target(inner, model, cache_state, expected=expected) as (url, facts):
            facts["cache_preparation"] = (
                f"fresh managed server process ({facts.get('cache_preparation', 'none')})"
            )
            facts["managed_command"] = server.argv
            yield url, facts
    finally:
        server.close()


@contextlib.contextmanager
def open_target(
    target: SimTarget | OpenAITarget,
    model: str,
    cache_state: str,
    *,
    ground_truth: str | Path | None = None,
    log_path: str | Path | None = None,
    expected: Any = None,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (base URL, cache-state facts) for one point, cold or warm as asked.

    ``expected`` is what the server must be: anything with the manifest's ``engine``, ``model``
    and ``target`` (a :class:`~capacity_pack.plan.manifest.Pack`, the sweep's inputs); without it
    only the served ``model`` name is compared.
    """
    if isinstance(target, SimTarget):
        sim = SimProcess(target, model, ground_truth=ground_truth, log_path=log_path)
        with sim:
            facts: dict[str, Any] = {"cache_preparation": "fresh simulated engine process"}
            if cache_state == "cold":
                facts.update(verify_cold(sim.base_url))
            yield sim.base_url, facts
        return
    assert isinstance(target, OpenAITarget)
    problem = engines.check_cache_reset(target)
    if problem is not None:
        raise TargetError(problem)
    if target.managed is not None:
        yield from _managed(target, model, cache_state, log_path=log_path, expected=expected)
        return
    base_url = target.base_url.rstrip("/")
    expected = _expected(target, model, expected)
    engine: Engine | None = getattr(expected, "engine", None)
    facts = {
        "cache_preparation": "none",
        "tls_verify": target.tls_verify,
        "ca_bundle": target.ca_bundle,
        "identity_check": target.identity_check,
    }
    if not target.tls_verify:
        log.warning("%s: TLS certificate verification is off (target.tls_verify false)", base_url)
    ep = Endpoint.for_target(target, base_url)
    try:
        # A restart replaces the process: identify the one that will be measured.
        restart_first = cache_state == "cold" and target.cache_reset == "restart"
        if restart_first:
            facts["cache_preparation"] = reset_prefix_cache(target, base_url, endpoint=ep)
        identity = identify(target, ep, expected, facts)
        ep.use_metric_map(
            (engine.metric_names if engine is not None else None)
            or identity.kind
            or (engine.name if engine is not None else None)
        )
        if cache_state == "cold":
            if not restart_first:
                facts["cache_preparation"] = reset_prefix_cache(
                    target, base_url, endpoint=ep, total_slots=identity.total_slots
                )
            slots = cold_evidence(ep, identity, target, engine)
            facts.update(verify_cold(base_url, endpoint=ep, slot_evidence=slots))
        else:
            facts["metric_map"] = ep.map_name
            facts["missing_evidence"] = ep.scrape().missing
        yield base_url, facts
    finally:
        ep.close()
