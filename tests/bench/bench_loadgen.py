"""Benchmark: the load generator's dispatch lateness, CPU cost, timing accuracy and collector.

Run (from the repository root, in the project's virtualenv, on a machine with >= 2 cores):

    python tests/bench/bench_loadgen.py --json bench-loadgen.json
    python tests/bench/bench_loadgen.py --server sim --rates 50,100,200 --json bench-sim.json

(the first against this script's static responder at 50-800 RPS, the second against the
simulator as it is), or, for the high rates alone, ``python tests/bench/bench_loadgen.py
--rates 400,800 --transports capacity_pack --no-pack``. Not collected by pytest
(``tests/bench`` is excluded). Results and conditions are recorded in docs/performance.md,
"Load generator".

Method. One server process serves every run. ``--server static`` (the default) is this script's
own responder (:class:`StaticSSE`, run as ``--serve-static`` in a child process, uvloop when
installed): HTTP/1.1 keep-alive, chunked ``text/event-stream``, one token per stream per
``--step-ms`` (10 ms, a typical decode step) from one global ticker, one write per stream per
tick, TCP_NODELAY, and a ground-truth log of the simulator's fields (arrival, first and last
token written, each stamped at its own write); it costs a few microseconds per token, so at 400
and 800 RPS the server is not the limit. ``--server sim`` is one ``capacity-pack sim serve``
(with its ground-truth log) whose profile is ``small-fast`` made step-bound: bandwidth and
FLOP/s raised a thousandfold, per-sequence overhead zero and ``step_overhead_ms = --step-ms``,
``max_num_seqs`` 4096, so every stream gets one token per step whatever the load and the
simulator never queues (it reads requests late above ~200 RPS on 2 cores). For each rate (50,
100, 200, 400 and 800 RPS by default) and each client transport (``--transports``:
``capacity_pack``, the load generator's own plain-HTTP transport, and ``httpx``, httpx's
default httpcore transport, with the same SSE reader; httpx only up to ``--httpx-max-rps``,
200), the default pack's Poisson schedule and request mix (~56 output tokens mean) is run for a
1 s warm-up plus ``--measure-s`` seconds through :func:`capacity_pack.measure.run.run_point`,
exactly as a sweep point runs it (metrics scraping included). Reported per run, from the run's
own summary and records:

- dispatch lateness p50/p99/max (actual send - due, every request of the run);
- client CPU per 1,000 streamed tokens (process CPU time from the clock's start to the end of
  the run, over the tokens streamed);
- measurement error: |client TTFT - server TTFT| and |client E2E - server E2E|, p50/p99, against
  the server's ground-truth log (:func:`capacity_pack.measure.sweep.measurement_error`), and
  where it arises: "to handler" = server arrival - client send (the request's way into the
  server's handler, invisible to its log), "to client" = |client read stamp - server send
  stamp| of first and last tokens (the client's share);
- every garbage collection of this process inside the window (the clock's start to the last
  request's end), logged through ``gc.callbacks`` (:class:`GcLog`): count per generation,
  longest and total pause, each pause over 1 ms with its time and generation; beside it the
  run summary's own ``gc_*`` client-health fields (:mod:`capacity_pack.measure.collector`);
- server CPU and other load (CPU that every other process of the machine used, in cores).

Then, unless ``--no-pack``, the acceptance point: the default pack (config/config.yaml, the
``small-fast`` profile, a fresh simulator) at its highest swept open-loop rate, cold, through
:func:`capacity_pack.measure.sweep.measure_point`, exactly as the sweep runs it, with its
measurement error.

Processes are not pinned unless ``--pin`` (server on CPU 0, client on CPU 1). Other
processes on the machine show up as lateness and error, so before each run the script waits
(up to ``--quiet-wait-s``) for the machine to be idle and reports the other load it saw.

``--sim-nodelay`` starts every simulator with TCP_NODELAY on its listening socket (through a
``sitecustomize`` on the children's PYTHONPATH): for simulators that bind their socket with
protocol 0, where asyncio does not set TCP_NODELAY on the accepted connections and a token
written after the response head waits, under Nagle's algorithm, for the client's delayed ACK
of the head (up to ~40 ms), which the server's log does not see.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

from tests.paths import ROOT


def _pin(cpu: int) -> None:
    if hasattr(os, "sched_setaffinity") and cpu < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {cpu})


def bench_profile(workdir: Path, step_ms: float) -> Path:
    from capacity_pack.sim.profile import load_profile

    data = load_profile("small-fast").model_dump()
    data["name"] = "bench-step-bound"
    data["hardware"].update(bandwidth_tb_s=400.0, dense_tflops=160_000.0)
    data["efficiency"].update(step_overhead_ms=step_ms, per_sequence_overhead_us=0.0)
    data["engine"].update(max_num_seqs=4096, max_waiting_requests=100_000)
    path = workdir / "bench-profile.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_cpu_s() -> float:
    """CPU-seconds the whole machine has spent busy (all processes), from /proc/stat."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def wait_for_quiet(max_wait_s: float, busy_limit: float = 0.15) -> float:
    """Wait (up to ``max_wait_s``) until the machine uses under ``busy_limit`` of a core."""
    deadline = time.monotonic() + max_wait_s
    while True:
        b0, t0 = machine_busy_cpu_s(), time.monotonic()
        time.sleep(1.0)
        busy = (machine_busy_cpu_s() - b0) / (time.monotonic() - t0)
        if busy < busy_limit or time.monotonic() > deadline:
            return busy


def load_pack(measure_s: float | None = None):
    from capacity_pack.plan.manifest import validate_pack

    data = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    if measure_s is not None:
        # A measured block of rate x measure_s requests after a 1 s warm-up, no fixed counts.
        data["client"].update(initial_scheduled_requests=1, warmup_seconds=1.0,
                              minimum_duration_seconds=measure_s)  # fmt: skip
        data["client"].pop("class_schedule_counts", None)
    return validate_pack(data)


def ms(summary_part: dict, key: str) -> float:
    v = summary_part.get(key)
    return float("nan") if v is None else float(v)


NODELAY_SITECUSTOMIZE = """\
import socket

_listen = socket.socket.listen


def listen(self, *args):
    if self.family in (socket.AF_INET, socket.AF_INET6) and self.type == socket.SOCK_STREAM:
        self.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return _listen(self, *args)


socket.socket.listen = listen
"""


def sim_nodelay(workdir: Path) -> None:
    """Children (the simulators) import this sitecustomize; this process is not affected."""
    site = workdir / "nodelay"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NODELAY_SITECUSTOMIZE)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    )


# --- the static responder -------------------------------------------------------------------

STATIC_EVENT_TEXT = b'" a"'  # one token by the client's counter (checked at start-up)


class StaticSSE:
    """A minimal OpenAI-compatible streaming responder (HTTP/1.1 keep-alive, chunked SSE).

    Every stream gets one token per tick (``step_ms``) from one global ticker, written as one
    chunk per stream per tick, so its cost is a few microseconds per token; the ground-truth
    log has the simulator's fields (arrival, first and last token written, CLOCK_MONOTONIC
    with a zero offset). ``/metrics`` answers an empty 200."""

    def __init__(self, step_ms: float, gt_path: str) -> None:
        self.step_s = step_ms / 1000
        self.gt = open(gt_path, "a", buffering=1)  # noqa: SIM115 - open for the server's life
        self.active: list[list] = []  # [transport, request_id, left, chat, usage, arrival, first]

    def tick(self, loop) -> None:
        loop.call_at(loop.time() + self.step_s, self.tick, loop)
        keep = []
        for s in self.active:
            tr, rid, left, chat, usage, arrival, first = s
            if tr.is_closing():
                continue
            if chat:
                body = (b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,'
                        b'"delta":{"content":' + STATIC_EVENT_TEXT + b'},"finish_reason":'
                        + (b'"length"' if left == 1 else b"null") + b"}]}\n\n")  # fmt: skip
            else:
                body = (b'data: {"id":"c","object":"text_completion","choices":[{"index":0,'
                        b'"text":' + STATIC_EVENT_TEXT + b',"finish_reason":'
                        + (b'"length"' if left == 1 else b"null") + b"}]}\n\n")  # fmt: skip
            if left == 1:
                if usage:
                    body += b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":0,' + (
                        b'"completion_tokens":%d,"total_tokens":%d}}\n\n' % (usage, usage)
                    )
                body += b"data: [DONE]\n\n"
            # Stamped at each write, as the simulator stamps its writes: one stamp for the
            # whole tick would put a later stream's write up to ~1 ms after its stamp.
            now_ns = time.monotonic_ns()
            tr.write(b"%x\r\n%s\r\n%s" % (len(body), body, b"0\r\n\r\n" if left == 1 else b""))
            if first is None:
                s[6] = first = now_ns
            if left == 1:
                line = json.dumps({"request_id": rid, "arrival_ns": arrival,
                                   "first_token_sent_ns": first, "last_token_sent_ns": now_ns,
                                   "clock_offset_ns": 0})  # fmt: skip
                self.gt.write(line + "\n")
            else:
                s[2] = left - 1
                keep.append(s)
        self.active = keep

    def protocol(self):
        import asyncio

        server = self

        class Conn(asyncio.Protocol):
            def connection_made(self, transport):
                self.tr, self.buf = transport, b""

            def data_received(self, data):
                arrival = time.monotonic_ns()
                self.buf += data
                while True:
                    end = self.buf.find(b"\r\n\r\n")
                    if end < 0:
                        return
                    head = self.buf[:end].decode("latin-1").split("\r\n")
                    fields = dict(
                        (k.strip().lower(), v.strip())
                        for k, _, v in (h.partition(":") for h in head[1:])
                    )
                    n = int(fields.get("content-length", 0))
                    if len(self.buf) < end + 4 + n:
                        return
                    body, self.buf = self.buf[end + 4 : end + 4 + n], self.buf[end + 4 + n :]
                    path = head[0].split(" ")[1]
                    if not path.endswith("completions"):
                        self.tr.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        continue
                    req = json.loads(body)
                    tokens = int(req.get("max_tokens") or req.get("max_completion_tokens") or 1)
                    usage = (req.get("stream_options") or {}).get("include_usage")
                    chat = path.endswith("chat/completions")
                    self.tr.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                                  b"transfer-encoding: chunked\r\n\r\n")  # fmt: skip
                    rid = fields.get("x-request-id", "")
                    server.active.append(
                        [self.tr, rid, tokens, chat, tokens if usage else 0, arrival, None]
                    )

        return Conn


def serve_static(port_file: str, step_ms: float, gt_path: str) -> None:
    import asyncio
    import gc
    import socket

    from capacity_pack.sim.tokenizer import count_tokens

    assert count_tokens(json.loads(STATIC_EVENT_TEXT)) == 1
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass

    async def main() -> None:
        loop = asyncio.get_running_loop()
        srv = StaticSSE(step_ms, gt_path)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(("127.0.0.1", 0))
        server = await loop.create_server(srv.protocol(), sock=sock, backlog=4096)
        Path(port_file).write_text(str(sock.getsockname()[1]))
        gc.freeze()
        loop.call_soon(srv.tick, loop)
        await server.serve_forever()

    asyncio.run(main())


class StaticServer:
    """This script's ``--serve-static`` mode in a child process (``url``, ``pid``)."""

    def __init__(self, workdir: Path, step_ms: float, gt: Path) -> None:
        self.port_file = workdir / "static.port"
        self.args = [sys.executable, __file__, "--serve-static", str(self.port_file),
                     "--step-ms", str(step_ms), "--gt", str(gt)]  # fmt: skip

    def __enter__(self):
        import subprocess

        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self.proc = subprocess.Popen(self.args, env=env)
        deadline = time.monotonic() + 30
        while not (self.port_file.exists() and self.port_file.read_text()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the static responder did not start")
            time.sleep(0.05)
        self.pid = self.proc.pid
        self.url = f"http://127.0.0.1:{self.port_file.read_text()}"
        return self

    def __exit__(self, *exc) -> None:
        self.proc.terminate()
        self.proc.wait(10)


class GcLog:
    """Every collection of this process (``gc.callbacks``): start (perf_counter_ns), pause
    (ns), generation, objects collected."""

    def __init__(self) -> None:
        self.events: list[tuple[int, int, int, int]] = []
        self._t = 0

    def __call__(self, phase: str, info: dict) -> None:
        now = time.perf_counter_ns()
        if phase == "start":
            self._t = now
        else:
            self.events.append((self._t, now - self._t, info["generation"], info["collected"]))

    def __enter__(self):
        import gc

        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc) -> None:
        import gc

        gc.callbacks.remove(self)

    def window(self, start_ns: int, end_ns: int) -> dict:
        """The collections that started inside [start_ns, end_ns]: count per generation, the
        longest pause, and each pause over 1 ms (seconds from ``start_ns``, ms, generation)."""
        inside = [e for e in self.events if start_ns <= e[0] <= end_ns]
        return {
            "collections": len(inside),
            "by_generation": {g: sum(e[2] == g for e in inside) for g in (0, 1, 2)},
            "pause_max_ms": max((e[1] / 1e6 for e in inside), default=0.0),
            "pause_total_ms": sum(e[1] for e in inside) / 1e6,
            "pauses_over_1ms": [
                {
                    "at_s": round((e[0] - start_ns) / 1e9, 3),
                    "ms": round(e[1] / 1e6, 2),
                    "generation": e[2],
                }
                for e in inside
                if e[1] > 1_000_000
            ],  # fmt: skip
        }


def run_one(pack, rate: float, transport: str, repeat: int, sim, gt: Path, out: Path) -> dict:
    from capacity_pack.measure.inputs import SweepInputs, load_settings
    from capacity_pack.measure.run import run_point
    from capacity_pack.measure.sweep import measurement_error
    from capacity_pack.plan import schedule as S

    point = S.Point(mode="open", rate_rps=rate, cache_state="cold", repeat=repeat)
    schedule = S.build_schedule(pack, point)
    settings = load_settings(SweepInputs.for_point(pack, point), point, sim.url, progress=False)
    settings.transport = transport
    records = out / f"r{rate:g}-{transport}.jsonl"
    busy0, srv0, own0, t0 = (
        machine_busy_cpu_s(), cpu_seconds(sim.pid), cpu_seconds(os.getpid()), time.monotonic(),
    )  # fmt: skip
    with GcLog() as log:
        summary = run_point(schedule, settings, records)
    busy1, srv1, own1, t1 = (
        machine_busy_cpu_s(), cpu_seconds(sim.pid), cpu_seconds(os.getpid()), time.monotonic(),
    )  # fmt: skip
    time.sleep(0.3)  # the server logs a request just after its last byte
    err = measurement_error(records, gt) | split_error(records, gt)
    wall = t1 - t0
    window = measured_window(records)
    return {
        "rate_rps": rate,
        "transport": transport,
        "requests": summary["sent"],
        "failed": summary["failed"],
        "streamed_tokens": summary["streamed_tokens"],
        "lateness_ms": summary["dispatch_lateness_ms"],
        "event_loop_lag_ms": summary["event_loop_lag_ms"],
        "client_cpu_ms_per_1k_tokens": summary["client_cpu_ms_per_1k_tokens"],
        "client_bound": summary["client_bound"],
        "dispatcher_scheduling": summary.get("dispatcher_scheduling"),
        "thread_placement": (summary.get("thread_placement") or {}).get("detail"),
        "measurement_error": err,
        # Every collection of this process inside the window (the clock's start to the last
        # request's end), and what the run's summary says of its own.
        "gc_in_window": log.window(*window),
        "gc_summary": {k: v for k, v in summary.items() if k.startswith("gc_")},
        "server_cpu_cores": (srv1 - srv0) / wall,
        "other_cpu_cores": ((busy1 - busy0) - (srv1 - srv0) - (own1 - own0)) / wall,
    }


def measured_window(records: Path) -> tuple[int, int]:
    """perf_counter_ns of the clock's start and of the last request's end."""
    from capacity_pack.measure.records import read_records

    rows = list(read_records(records))
    return min(r["t0_ns"] for r in rows), max(r["end_ns"] for r in rows)


def split_error(records: Path, gt: Path) -> dict:
    """p50/p99 (ms) of server arrival - client send, and of |client stamp - server send| of
    the first and last tokens."""
    import numpy as np

    from capacity_pack.measure.records import read_records

    server = {}
    with gt.open() as fh:
        for line in fh:
            if line.endswith("\n"):
                g = json.loads(line)
                server[g["request_id"]] = g
    to_handler, to_client = [], []
    for r in read_records(records):
        g = server.get(r["request_id"])
        if r["status"] != "ok" or g is None or g.get("first_token_sent_ns") is None:
            continue
        off = g["clock_offset_ns"]
        to_handler.append(g["arrival_ns"] - off - r["sent_ns"])
        to_client.append(abs(r["first_token_ns"] - (g["first_token_sent_ns"] - off)))
        to_client.append(abs(r["last_token_ns"] - (g["last_token_sent_ns"] - off)))
    if not to_handler:
        return {}
    q = lambda x, p: float(np.percentile(np.array(x) / 1e6, p))  # noqa: E731
    return {
        "to_handler_ms": {"p50": q(to_handler, 50), "p99": q(to_handler, 99)},
        "to_client_ms": {"p50": q(to_client, 50), "p99": q(to_client, 99)},
    }


def pack_point(out: Path) -> dict:
    from capacity_pack.measure.sweep import measure_point, measurement_error
    from capacity_pack.plan import schedule as S

    pack = load_pack()
    rate = max(pack.sweep.open_loop_rps)
    point = S.Point(mode="open", rate_rps=rate, cache_state="cold", repeat=0)
    busy0, own0, t0 = machine_busy_cpu_s(), cpu_seconds(os.getpid()), time.monotonic()
    summary = measure_point(pack, point, S.build_schedule(pack, point), out)
    wall = time.monotonic() - t0
    # The simulator ran in its own process; all of the machine's other CPU is listed together.
    other = ((machine_busy_cpu_s() - busy0) - (cpu_seconds(os.getpid()) - own0)) / wall
    records, gt = out / "records.jsonl", out / "ground_truth.jsonl"
    err = measurement_error(records, gt) | split_error(records, gt)
    return {
        "rate_rps": rate,
        "transport": "capacity_pack",
        "requests": summary["sent"],
        "failed": summary["failed"],
        "streamed_tokens": summary["streamed_tokens"],
        "lateness_ms": summary["dispatch_lateness_ms"],
        "client_cpu_ms_per_1k_tokens": summary["client_cpu_ms_per_1k_tokens"],
        "dispatcher_scheduling": summary.get("dispatcher_scheduling"),
        "thread_placement": (summary.get("thread_placement") or {}).get("detail"),
        "measurement_error": err,
        "server_and_other_cpu_cores": other,
    }


def line(r: dict) -> str:
    late, err = r["lateness_ms"], r["measurement_error"]
    ttft, e2e = err.get("ttft_abs_error_ms", {}), err.get("e2e_abs_error_ms", {})
    handler, client = err.get("to_handler_ms", {}), err.get("to_client_ms", {})
    other = r.get("other_cpu_cores", r.get("server_and_other_cpu_cores", float("nan")))
    server = r.get("server_cpu_cores")
    return (
        f"{r['rate_rps']:5g} RPS  {r['transport']:<13} lateness p50 {ms(late, 'p50'):6.3f} "
        f"p99 {ms(late, 'p99'):7.3f} ms  CPU {r['client_cpu_ms_per_1k_tokens'] or 0:6.1f} ms/1k "
        f"tokens  |dTTFT| p50 {ms(ttft, 'p50'):6.3f} p99 {ms(ttft, 'p99'):7.3f} ms  "
        f"|dE2E| p50 {ms(e2e, 'p50'):6.3f} p99 {ms(e2e, 'p99'):7.3f} ms  "
        f"(to handler p99 {ms(handler, 'p99'):7.3f}, to client p99 {ms(client, 'p99'):6.3f})  "
        f"failed {r['failed']}/{r['requests']}  {r.get('dispatcher_scheduling')}  "
        + (f"server {server:4.2f} cores  " if server is not None else "")
        + f"other {other:4.2f} cores"
        + (f"\n      threads: {r['thread_placement']}" if r.get("thread_placement") else "")
        + (
            f"\n      gc in window: {g['collections']} collections {g['by_generation']}, "
            f"max {g['pause_max_ms']:.2f} ms, total {g['pause_total_ms']:.1f} ms, "
            f"over 1 ms: {g['pauses_over_1ms']}"
            if (g := r.get("gc_in_window"))
            else ""
        )
        + (
            f"\n      summary: max {h.get('gc_pause_max_ms')} ms, over 1 ms "
            f"{h.get('gc_pauses_over_1ms_count')}, after the window "
            f"{h.get('gc_after_window_ms')} ms freeing {h.get('gc_freed_after_window')} objects"
            if (h := r.get("gc_summary"))
            else ""
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rates", default="50,100,200,400,800", help="Comma-separated open-loop RPS."
    )
    parser.add_argument("--transports", default="capacity_pack,httpx")
    parser.add_argument(
        "--httpx-max-rps", type=float, default=200.0, help="httpx's transport up to this rate."
    )
    parser.add_argument(
        "--server", choices=("static", "sim"), default="static",
        help="The responder: this script's static one (default) or the simulator.",
    )  # fmt: skip
    parser.add_argument("--serve-static", metavar="PORT_FILE", help=argparse.SUPPRESS)
    parser.add_argument("--gt", help=argparse.SUPPRESS)
    parser.add_argument("--measure-s", type=float, default=10.0)
    parser.add_argument("--step-ms", type=float, default=10.0, help="Modelled decode step.")
    parser.add_argument("--no-pack", action="store_true", help="Skip the default-pack point.")
    parser.add_argument("--pin", action="store_true", help="Simulator on CPU 0, client on 1.")
    parser.add_argument(
        "--sim-nodelay", action="store_true", help="TCP_NODELAY on the simulators' sockets."
    )
    parser.add_argument("--quiet-wait-s", type=float, default=60.0)
    parser.add_argument("--json", type=Path, default=None, help="Write the results here.")
    args = parser.parse_args()
    if args.serve_static:
        serve_static(args.serve_static, args.step_ms, args.gt)
        return 0
    rates = [float(x) for x in args.rates.split(",") if x]
    transports = [x for x in args.transports.split(",") if x]

    from capacity_pack.sim.process import SimProcess

    results: list[dict] = []
    conditions = {
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "loadavg_before": os.getloadavg(),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "pinned": args.pin,
        "sim_nodelay": args.sim_nodelay,
        "server": args.server,
    }
    print(f"conditions: {conditions}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-loadgen-") as tmp:
        out = Path(tmp)
        if args.sim_nodelay:
            sim_nodelay(out)
        gt = out / "ground_truth.jsonl"
        profile = bench_profile(out, args.step_ms)
        pack = load_pack(args.measure_s)
        sim_args = ["--profile", str(profile), "--model-name", "sim-small", "--ground-truth", gt]
        server = (
            StaticServer(out, args.step_ms, gt)
            if args.server == "static"
            else SimProcess(*map(str, sim_args))
        )
        with server as sim:
            if args.pin:
                os.sched_setaffinity(sim.pid, {0})
                _pin(1)
            for rate in rates:
                for k, transport in enumerate(transports):
                    if transport == "httpx" and rate > args.httpx_max_rps:
                        continue  # client-bound long before: minutes of backlog to drain
                    wait_for_quiet(args.quiet_wait_s)
                    r = run_one(pack, rate, transport, k, sim, gt, out)
                    print(line(r), flush=True)
                    results.append(r)
        if args.pin:
            os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        if not args.no_pack:
            wait_for_quiet(args.quiet_wait_s)
            r = pack_point(out / "pack")
            print("default pack, open loop:", flush=True)
            print(line(r), flush=True)
            results.append(r)
    conditions["loadavg_after"] = os.getloadavg()
    if args.json:
        text = json.dumps({"conditions": conditions, "results": results}, indent=2)
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
