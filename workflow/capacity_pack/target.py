"""The system under test: start the simulated engine, or reach and reset a real endpoint.

- ``sim`` targets: :class:`SimProcess` starts ``capacity-pack sim serve`` (one replica) or
  ``capacity-pack sim cluster`` (several, behind the health-checking router) on a free port of
  127.0.0.1, waits for ``/health``, and stops it (SIGTERM, then SIGKILL) when the point ends. Every
  point gets a fresh process, so a cold point starts from an empty cache by construction and a
  warm point starts from the same state before it is prewarmed.
- ``openai`` targets: the configured URL. A cold point first resets the prefix cache: the
  configured restart command, or vLLM's ``POST /reset_prefix_cache`` / SGLang's
  ``POST /flush_cache`` after the engine has drained.

Either way :func:`verify_cold` then reads ``/metrics`` and requires an idle engine (nothing
running or waiting) with no KV blocks in use, and records the prefix-cache counters it starts
from, so the point's hit rate is measured from a known-empty cache.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from capacity_pack.loadgen import parse_metrics
from capacity_pack.manifest import OpenAITarget, SimTarget


class TargetError(RuntimeError):
    """The target could not be started, reached or reset."""


class SimProcess:
    """A simulated engine (or cluster) for one pack target, on a free port of 127.0.0.1.

    A thin adapter over :class:`capacity_pack.sim.process.SimProcess` (which also makes the
    child die with this process, so an interrupted measurement leaves no server behind).
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
            raise TargetError(str(err)) from None
        self.base_url = self._proc.url
        deadline = time.monotonic() + self.startup_timeout_s
        while not _healthy(self.base_url):
            if time.monotonic() > deadline:
                self.stop()
                raise TargetError(f"simulated engine not healthy within {self.startup_timeout_s} s")
            time.sleep(0.05)
        return self.base_url

    def stop(self) -> None:
        if self._proc is None:
            return
        self._proc.stop()
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log_path.write_text(self._proc.stderr_text())
        self._proc.close()
        self._proc = None

    def __enter__(self) -> SimProcess:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _healthy(base_url: str, timeout_s: float = 1.0) -> bool:
    import httpx

    try:
        return httpx.get(f"{base_url}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def scrape(base_url: str, timeout_s: float = 5.0) -> dict[str, float]:
    import httpx

    resp = httpx.get(f"{base_url}/metrics", timeout=timeout_s)
    resp.raise_for_status()
    return parse_metrics(resp.text)


def reset_prefix_cache(target: OpenAITarget, base_url: str, *, timeout_s: float = 120.0) -> str:
    """Clear a real engine's prefix cache for a cold point; returns what was done."""
    import httpx

    if target.cache_reset == "none":
        return "none"
    if target.cache_reset == "restart":
        assert target.restart_command is not None
        result = subprocess.run(target.restart_command, capture_output=True, text=True)
        if result.returncode != 0:
            raise TargetError(
                f"target.restart_command exited with {result.returncode}: {result.stderr[-500:]}"
            )
        deadline = time.monotonic() + timeout_s
        while not _healthy(base_url):
            if time.monotonic() > deadline:
                raise TargetError(f"{base_url} not healthy {timeout_s} s after the restart")
            time.sleep(0.5)
        return "restart"
    path = "/reset_prefix_cache" if target.cache_reset == "vllm" else "/flush_cache"
    deadline = time.monotonic() + timeout_s
    while True:
        wait_idle(base_url, timeout_s=timeout_s)
        resp = httpx.post(f"{base_url}{path}", timeout=30)
        if resp.status_code >= 400:
            raise TargetError(f"POST {path} answered {resp.status_code}: {resp.text[:300]}")
        # vLLM answers 200 even when it refuses (blocks still in use); a JSON body says so.
        try:
            refused = resp.json().get("reset") is False
        except (ValueError, AttributeError):
            refused = False
        if not refused:
            return path
        if time.monotonic() > deadline:
            raise TargetError(f"POST {path} kept refusing for {timeout_s} s: {resp.text[:300]}")
        time.sleep(0.5)


def wait_idle(base_url: str, *, timeout_s: float = 60.0) -> dict[str, float]:
    """Wait until nothing runs or waits (the metrics say so); return the last scrape."""
    deadline = time.monotonic() + timeout_s
    while True:
        m = scrape(base_url)
        if m.get("running", 0) == 0 and m.get("queue_depth", 0) == 0:
            return m
        if time.monotonic() > deadline:
            raise TargetError(f"{base_url} still busy after {timeout_s} s: {m}")
        time.sleep(0.2)


def verify_cold(base_url: str) -> dict[str, Any]:
    """Check the engine is idle with no KV blocks in use; the counters the point starts from."""
    m = wait_idle(base_url)
    kv = m.get("kv_usage")
    ok = kv is None or kv <= 1e-9
    return {
        "cache_empty_verified": bool(ok and kv is not None),
        "kv_usage_at_start": kv,
        "prefix_cache_hits_at_start": m.get("prefix_cache_hits"),
        "prefix_cache_queries_at_start": m.get("prefix_cache_queries"),
    }


@contextlib.contextmanager
def open_target(
    target: SimTarget | OpenAITarget,
    model: str,
    cache_state: str,
    *,
    ground_truth: str | Path | None = None,
    log_path: str | Path | None = None,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield (base URL, cache-state facts) for one point, cold or warm as asked."""
    if isinstance(target, SimTarget):
        sim = SimProcess(target, model, ground_truth=ground_truth, log_path=log_path)
        with sim:
            facts: dict[str, Any] = {"cache_preparation": "fresh simulated engine process"}
            if cache_state == "cold":
                facts.update(verify_cold(sim.base_url))
            yield sim.base_url, facts
        return
    assert isinstance(target, OpenAITarget)
    base_url = target.base_url.rstrip("/")
    facts = {"cache_preparation": "none"}
    if cache_state == "cold":
        facts["cache_preparation"] = reset_prefix_cache(target, base_url)
        facts.update(verify_cold(base_url))
    yield base_url, facts
