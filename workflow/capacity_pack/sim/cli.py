"""``capacity-pack sim``: run the simulated engine (one replica, or a cluster behind a router).

Heavy imports (starlette, uvicorn, httpx) happen inside the commands so that ``--help`` is fast.
``--port 0`` binds a free port; ``--port-file`` receives it (written atomically once the server
accepts requests), and the ``listening on`` line on standard output names it too. Both servers
guard their control plane (:mod:`capacity_pack.sim.control`): a token in a 0600 file
(``--token-file``, else next to ``--port-file``), JSON bodies, a ``Host`` check; binding an address
other than loopback needs ``--allow-remote`` (else a one-line error and exit status 2).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click


class _Fail(click.ClickException):
    """A user-facing error: printed without a traceback, exit status 1."""


def _stack_options(func):
    """``--loop`` and ``--http``: the event loop and HTTP/1.1 parser uvicorn serves with."""
    options = [
        click.option(
            "--loop",
            "loop",
            type=click.Choice(["auto", "uvloop", "asyncio"]),
            default="auto",
            show_default=True,
            help="Event loop; auto: uvloop when installed (uvicorn[standard]), else asyncio.",
        ),
        click.option(
            "--http",
            "http",
            type=click.Choice(["auto", "httptools", "h11"]),
            default="auto",
            show_default=True,
            help="HTTP/1.1 parser; auto: httptools when installed (uvicorn[standard]), else h11.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _fault_options(func):
    options = [
        click.option(
            "--fault-error-rate",
            type=click.FloatRange(0, 1),
            default=0.0,
            show_default=True,
            help="Share of requests answered with an injected error.",
        ),
        click.option(
            "--fault-error-status",
            type=click.Choice(["429", "500", "502", "503"]),
            default="500",
            show_default=True,
            help="HTTP status of injected errors.",
        ),
        click.option(
            "--fault-stall-every-s",
            type=click.FloatRange(min=0),
            default=0.0,
            show_default=True,
            help="Stall the engine at the start of every period.",
        ),
        click.option(
            "--fault-stall-s",
            type=click.FloatRange(min=0),
            default=0.0,
            show_default=True,
            help="Length of each periodic stall.",
        ),
        click.option(
            "--fault-disconnect-rate",
            type=click.FloatRange(0, 1),
            default=0.0,
            show_default=True,
            help="Share of streams cut mid-stream.",
        ),
        click.option(
            "--fault-kv-fraction",
            type=click.FloatRange(0, 1, min_open=True),
            default=1.0,
            show_default=True,
            help="Share of KV blocks usable.",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _control_options(func):
    options = [
        click.option(
            "--token-file",
            type=click.Path(dir_okay=False, path_type=Path),
            default=None,
            help="Write the control-plane token here (mode 0600) before the port file "
            "(default: PORT_FILE.token next to --port-file, else a private temporary file "
            "named on the 'listening on' line).",
        ),
        click.option(
            "--allowed-host",
            "allowed_hosts",
            multiple=True,
            metavar="NAME",
            help="Another name the Host header may carry besides the bound address and "
            "loopback (a DNS name clients reach this server by; repeatable).",
        ),
        click.option(
            "--allow-remote",
            is_flag=True,
            default=False,
            help="Allow a --host other than loopback (the server is then reachable from other "
            "machines; a warning is printed).",
        ),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def _check_bind(host: str, allow_remote: bool) -> None:
    """Refuse a non-loopback ``host`` without ``--allow-remote``: one line, exit status 2."""
    from capacity_pack.sim.control import bind_problem

    error, warning = bind_problem(host, allow_remote)
    if error is not None:
        click.echo(f"Error: {error}", err=True)
        sys.exit(2)
    if warning is not None:
        click.echo(warning, err=True)


def _serve(
    app: Any,
    host: str,
    port: int,
    *,
    port_file: Path | None,
    token_file: Path | None,
    allowed_hosts: tuple[str, ...],
    announce: str,
    log_level: str,
    graceful_s: float = 2.0,
    loop: str = "auto",
    http: str = "auto",
    on_start: Any = None,
) -> None:
    """Bind, write the token file, and serve ``app`` behind the control guard on the event
    loop and HTTP parser ``loop`` and ``http`` name (``on_start`` receives what runs)."""
    from capacity_pack.sim import control
    from capacity_pack.sim.serving import bind_socket, run_app, serving_stack

    try:
        loop, http = serving_stack(loop, http)
    except ValueError as err:
        raise _Fail(str(err)) from None
    try:
        sock = bind_socket(host, port)
    except OSError as err:
        raise _Fail(f"cannot bind {host}:{port}: {err}") from None
    token = control.new_token()
    policy = control.HostPolicy.for_bind(host, sock.getsockname()[1], allowed_hosts)
    shown = f"[{host}]" if ":" in host else host
    with control.token_file(token, token_file, port_file) as path:
        # run_app formats the line with the port: braces in the path stay literal.
        where = str(path).replace("{", "{{").replace("}", "}}")
        run_app(
            control.ControlGuard(app, token=token, hosts=policy),
            sock,
            port_file=port_file,
            announce=f"{announce} listening on http://{shown}:{{port}} ({{loop}} + {{http}}; "
            f"control token in {where})",
            log_level=log_level,
            graceful_s=graceful_s,
            loop=loop,
            http=http,
            on_start=on_start,
        )


def _faults(kwargs: dict) -> list[str]:
    """The fault flags as ``serve`` arguments (the cluster passes them to every replica)."""
    return [
        "--fault-error-rate",
        str(kwargs["fault_error_rate"]),
        "--fault-error-status",
        kwargs["fault_error_status"],
        "--fault-stall-every-s",
        str(kwargs["fault_stall_every_s"]),
        "--fault-stall-s",
        str(kwargs["fault_stall_s"]),
        "--fault-disconnect-rate",
        str(kwargs["fault_disconnect_rate"]),
        "--fault-kv-fraction",
        str(kwargs["fault_kv_fraction"]),
    ]


def _load(profile: str, **overrides):
    from capacity_pack.sim.profile import ProfileError, load_profile

    try:
        loaded = load_profile(profile)
        return (
            loaded.with_overrides(**overrides)
            if any(v is not None for v in overrides.values())
            else loaded
        )
    except ProfileError as err:
        raise _Fail(str(err)) from None
    except ValueError as err:
        raise _Fail(f"{profile}: {err}") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def sim() -> None:
    """The embedded simulated engine: an OpenAI-compatible server with a performance model."""


@sim.command()
def profiles() -> None:
    """List the shipped performance profiles with their derived figures."""
    from capacity_pack.sim.perf import PerfModel
    from capacity_pack.sim.profile import load_profile, shipped_profiles

    for name in shipped_profiles():
        p = load_profile(name)
        perf = PerfModel(p)
        click.echo(
            f"{name}: {p.model.name} on {p.engine.tensor_parallel} x {p.hardware.name}; "
            f"KV {p.num_gpu_blocks} blocks ({p.num_gpu_blocks * p.engine.block_size} tokens); "
            f"batch-1 decode {perf.decode_step_s(1, 512) * 1e3:.2f} ms; "
            f"1024-token prefill {perf.prefill_s(1024) * 1e3:.1f} ms"
        )


@sim.command()
@click.option(
    "--profile",
    default="small-fast",
    show_default=True,
    help="Shipped profile name or path of a profile YAML file.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="Port to bind (0: a free port, see --port-file).",
)
@click.option(
    "--port-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the bound port here once the server accepts requests.",
)
@_control_options
@click.option("--model-name", default=None, help="Served model name (default: the profile's).")
@click.option(
    "--ground-truth",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Append one JSON line per request to this file.",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of EOS draws and fault draws."
)
@click.option(
    "--max-num-seqs",
    type=click.IntRange(min=1),
    default=None,
    help="Override the profile's max_num_seqs.",
)
@click.option(
    "--max-num-batched-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Override the profile's token budget per step.",
)
@click.option(
    "--max-waiting-requests",
    type=click.IntRange(min=1),
    default=None,
    help="Override the profile's admission limit.",
)
@click.option(
    "--enable-prefix-caching/--no-enable-prefix-caching",
    default=None,
    help="Override the profile's prefix caching.",
)
@_fault_options
@click.option(
    "--kill-after-s",
    type=click.FloatRange(min=0),
    default=None,
    help="Hard-kill (SIGKILL) the server this long after it starts.",
)
@click.option(
    "--engine-index",
    type=int,
    default=0,
    show_default=True,
    help="Value of the 'engine' metrics label.",
)
@click.option("--replica-id", type=int, default=None, help="Replica number for the log.")
@click.option(
    "--startup-delay-s",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds before the server listens (weights loading and warm-up of a cold replica).",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="warning",
    show_default=True,
)
@_stack_options
def serve(
    profile: str,
    host: str,
    port: int,
    port_file: Path | None,
    token_file: Path | None,
    allowed_hosts: tuple[str, ...],
    allow_remote: bool,
    model_name: str | None,
    ground_truth: Path | None,
    seed: int,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    max_waiting_requests: int | None,
    enable_prefix_caching: bool | None,
    kill_after_s: float | None,
    engine_index: int,
    replica_id: int | None,
    startup_delay_s: float,
    log_level: str,
    loop: str,
    http: str,
    **fault_kwargs,
) -> None:
    """Serve one simulated replica on HOST:PORT until interrupted."""
    import gc
    import logging
    import time

    _check_bind(host, allow_remote)
    # Nothing listens while a real engine loads weights: health checks are refused meanwhile.
    time.sleep(startup_delay_s)

    from capacity_pack.sim.engine import Engine, Faults
    from capacity_pack.sim.pacing import GC_SAFETY_THRESHOLD, SWITCH_INTERVAL_S
    from capacity_pack.sim.server import SimServer

    loaded = _load(
        profile,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_waiting_requests=max_waiting_requests,
        enable_prefix_caching=enable_prefix_caching,
    )
    faults = Faults(
        error_rate=fault_kwargs["fault_error_rate"],
        error_status=int(fault_kwargs["fault_error_status"]),
        stall_every_s=fault_kwargs["fault_stall_every_s"],
        stall_s=fault_kwargs["fault_stall_s"],
        disconnect_rate=fault_kwargs["fault_disconnect_rate"],
        kv_capacity_fraction=fault_kwargs["fault_kv_fraction"],
    )
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    engine = Engine(
        loaded,
        model_name=model_name,
        seed=seed,
        faults=faults,
        ground_truth=ground_truth,
        engine_index=engine_index,
        replica=replica_id,
        kill_after_s=kill_after_s,
    )
    server = SimServer(engine)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    engine.collect_between_steps = True
    gc.set_threshold(GC_SAFETY_THRESHOLD, *gc.get_threshold()[1:])
    _serve(
        server.app(),
        host,
        port,
        port_file=port_file,
        token_file=token_file,
        allowed_hosts=allowed_hosts,
        announce=f"capacity-pack sim: {loaded.name} ({engine.model_name})",
        log_level=log_level,
        loop=loop,
        http=http,
        on_start=server.stack.update,
    )


def _replica_command(text: str | None) -> list[str] | None:
    """``--replica-command``'s JSON argv, checked."""
    if text is None:
        return None
    import json

    try:
        argv = json.loads(text)
    except ValueError as err:
        raise _Fail(f"--replica-command: not JSON ({err})") from None
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        raise _Fail("--replica-command: expected a JSON list of strings (an argv)")
    if not any("{port}" in a for a in argv):
        raise _Fail("--replica-command: no {port} placeholder (the router picks each port)")
    return argv


@sim.command()
@click.option("--replicas", type=click.IntRange(min=1), required=True, help="Replica count.")
@click.option(
    "--profile",
    default="small-fast",
    show_default=True,
    help="Shipped profile name or path of a profile YAML file.",
)
@click.option(
    "--router",
    "policy",
    type=click.Choice(["round_robin", "least_outstanding"]),
    default="least_outstanding",
    show_default=True,
    help="Routing policy.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Router address.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="Router port (0: a free port, see --port-file).",
)
@click.option(
    "--port-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the router's port here once every replica is up.",
)
@_control_options
@click.option("--model-name", default=None, help="Served model name (default: the profile's).")
@click.option(
    "--ground-truth",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="One JSONL file all replicas append to (lines carry 'replica').",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Replica i uses seed + i.")
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=None)
@click.option("--max-waiting-requests", type=click.IntRange(min=1), default=None)
@_fault_options
@click.option(
    "--health-interval-s",
    type=click.FloatRange(min=0.05),
    default=0.5,
    show_default=True,
    help="Seconds between health checks of each replica.",
)
@click.option(
    "--kill",
    "kills",
    multiple=True,
    metavar="REPLICA@SECONDS",
    help="SIGKILL a replica this long after the cluster is up (repeatable).",
)
@click.option(
    "--restart",
    "restarts",
    multiple=True,
    metavar="REPLICA@SECONDS",
    help="Restart a replica this long after the cluster is up (repeatable).",
)
@click.option(
    "--add",
    "adds",
    multiple=True,
    type=click.FloatRange(min=0),
    metavar="SECONDS",
    help="Add a replica (the next index) this long after the cluster is up (repeatable).",
)
@click.option(
    "--admission-max-outstanding",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Answer 429 while every healthy replica has this many requests in flight (0: off).",
)
@click.option(
    "--retries",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="Retry a request on another replica this many times when a replica cannot be reached.",
)
@click.option(
    "--restart-after-s",
    type=click.FloatRange(min=0),
    default=None,
    help="Restart a replica whose process died this long after the router noticed "
    "(default: never).",
)
@click.option(
    "--cold-start-s",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds a replica started after the cluster is up (restart, scale-out) takes to load "
    "before it serves; the initial replicas are taken as already running.",
)
@click.option(
    "--replica-command",
    default=None,
    metavar="JSON",
    help="Replicas are this command, not simulated engines: a JSON list (argv) with {port} and "
    "optionally {host} and {tmpdir} placeholders, e.g. an llama-server line.",
)
@click.option(
    "--ready-path",
    default="/health",
    show_default=True,
    help="A command replica is ready (and healthy) while GET of this path answers 200.",
)
@click.option(
    "--replica-startup-timeout-s",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="Most seconds the initial replicas may take to become healthy.",
)
@click.option(
    "--upstream-keep-alive/--no-upstream-keep-alive",
    default=True,
    show_default=True,
    help="Reuse connections to the replicas (off: one per request, for a server that drops "
    "reused connections).",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="warning",
    show_default=True,
)
@_stack_options
def cluster(**opts: Any) -> None:
    """Serve REPLICAS simulated replicas behind a health-checking router (admission control,
    retries on unreachable replicas, optional supervisor restarts and scheduled scale-out)."""
    import logging

    from capacity_pack.sim.cluster import Cluster, cluster_app, parse_schedule

    replicas, profile, policy = opts["replicas"], opts["profile"], opts["policy"]
    _check_bind(opts["host"], opts["allow_remote"])
    command = _replica_command(opts["replica_command"])
    if command is None:
        _load(profile)  # fail here, once, rather than in every replica
    try:
        actions = [("kill", i, t) for i, t in parse_schedule(opts["kills"], "kill", replicas)]
        actions += [
            ("restart", i, t) for i, t in parse_schedule(opts["restarts"], "restart", replicas)
        ]
    except ValueError as err:
        raise _Fail(str(err)) from None
    logging.basicConfig(level=opts["log_level"].upper(), format="%(asctime)s %(name)s %(message)s")
    the_cluster = Cluster(
        replicas,
        _replica_serve_args(opts),
        policy=policy,
        health_interval_s=opts["health_interval_s"],
        actions=actions,
        seed=opts["seed"],
        admission_max_outstanding=opts["admission_max_outstanding"],
        retries=opts["retries"],
        restart_after_s=opts["restart_after_s"],
        add_at_s=opts["adds"],
        cold_start_s=opts["cold_start_s"],
        replica_command=command,
        ready_path=opts["ready_path"],
        upstream_keep_alive=opts["upstream_keep_alive"],
        startup_timeout_s=opts["replica_startup_timeout_s"],
    )
    what = f"`{command[0]}`" if command else profile
    _serve(
        cluster_app(the_cluster),
        opts["host"],
        opts["port"],
        port_file=opts["port_file"],
        token_file=opts["token_file"],
        allowed_hosts=opts["allowed_hosts"],
        announce=f"capacity-pack sim cluster: {replicas} x {what} ({policy})",
        log_level=opts["log_level"],
        graceful_s=5.0,
        loop=opts["loop"],
        http=opts["http"],
    )


def _replica_serve_args(opts: dict[str, Any]) -> list[str]:
    """The ``serve`` arguments every simulated replica of the cluster starts with."""
    args = ["--profile", opts["profile"], "--log-level", opts["log_level"], *_faults(opts)]
    args += ["--loop", opts["loop"], "--http", opts["http"]]
    if opts["model_name"]:
        args += ["--model-name", opts["model_name"]]
    if opts["ground_truth"]:
        args += ["--ground-truth", str(opts["ground_truth"].resolve())]
    if opts["max_num_seqs"]:
        args += ["--max-num-seqs", str(opts["max_num_seqs"])]
    if opts["max_waiting_requests"]:
        args += ["--max-waiting-requests", str(opts["max_waiting_requests"])]
    return args
