"""llama.cpp's own HTTP server (llama-server's C++ code) from PyPI's prebuilt `xllamacpp` wheel,
started with llama-server's command-line flags: the real-engine tier's server, with nothing to
compile.

    python -m capacity_pack.llamacpp_server -m MODEL.gguf --host 127.0.0.1 --port 8080 \
        -np 4 -c 4096 -t 2 --cache-ram 0 --slot-save-path DIR --metrics --no-ui

Why not llama-server itself: PyPI has no llama-server binary, and building one from llama.cpp's
source took 7-8 minutes of both cores of a 2-core VM (22-24 minutes beside the test suite), most
of CI's time. `xllamacpp` (https://github.com/xorbitsai/xllamacpp) links llama.cpp's server code
into a Python extension: `xllamacpp.Server(params)` starts the same HTTP server (OpenAI
endpoints, /health, /props, /metrics, /slots, /tokenize, continuous batching over parallel
slots) on background threads. Its Linux CPU wheel is built for a baseline x86-64 with AVX2, not
for this CPU (`-march=native`): a native build is somewhat faster per token; a pack measures
the server it runs, whichever it is (`engine.version` names the wheel).

A module of the package (run with ``-m``), so that a managed command finds it from any working
directory; it imports nothing else of the project. Only the flags the shipped packs use are
mapped (llama-server's meaning, same spelling); any other flag is an error that names it. The
process serves until SIGTERM or SIGINT, then stops the server and exits 0.
"""

from __future__ import annotations

import argparse
import signal
import sys


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m capacity_pack.llamacpp_server",
        description="llama.cpp's server (xllamacpp) with llama-server's flags.",
    )
    p.add_argument("-m", "--model", required=True, help="GGUF file")
    p.add_argument("--alias", help="model name the server answers to")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("-np", "--parallel", type=int, default=1, help="slots")
    p.add_argument("-c", "--ctx-size", type=int, default=4096, help="context, all slots")
    p.add_argument("-t", "--threads", type=int, default=-1, help="threads (generation, batch)")
    p.add_argument("-b", "--batch-size", type=int, default=2048)
    p.add_argument("-ub", "--ubatch-size", type=int, default=512)
    p.add_argument("--cache-ram", type=int, default=None, help="host prompt cache, MiB")
    p.add_argument("--slot-save-path", default="", help="enables slot actions (erase)")
    p.add_argument("--metrics", action="store_true", help="Prometheus /metrics")
    p.add_argument("--no-slots", action="store_true", help="no GET /slots")
    p.add_argument("--no-ui", action="store_true", help="no web UI")
    return p.parse_args(argv)


def params(args: argparse.Namespace):  # -> xllamacpp.CommonParams
    import xllamacpp

    p = xllamacpp.CommonParams()
    p.model.path = args.model
    if args.alias:
        p.model_alias = {args.alias}
    p.hostnames = [args.host]
    p.port = args.port
    p.n_parallel = args.parallel
    p.n_ctx = args.ctx_size
    p.n_batch = args.batch_size
    p.n_ubatch = args.ubatch_size
    if args.threads > 0:
        p.cpuparams.n_threads = args.threads
        p.cpuparams_batch.n_threads = args.threads
    if args.cache_ram is not None:
        p.cache_ram_mib = args.cache_ram
    p.slot_save_path = args.slot_save_path
    p.endpoint_metrics = args.metrics
    p.endpoint_slots = not args.no_slots
    p.ui = not args.no_ui
    return p


def main(argv: list[str]) -> int:
    args = parse(argv)
    try:
        import xllamacpp
    except ImportError:
        print(
            "capacity_pack.llamacpp_server: the Python package xllamacpp is not installed "
            "(bash scripts/install-real-engine.sh)",
            file=sys.stderr,
        )
        return 1
    # Block the stop signals before the server's threads start, so that they inherit the mask
    # and sigwait() below is the one place a stop signal lands.
    stop = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    try:
        server = xllamacpp.Server(params(args))
    except Exception as err:  # the server's own message (e.g. a model that does not load)
        print(f"capacity_pack.llamacpp_server: {args.model}: {err}", file=sys.stderr)
        return 1
    address = server.listening_address
    print(f"capacity_pack.llamacpp_server: listening on {address}", file=sys.stderr, flush=True)
    signal.sigwait(stop)
    del server  # stops the HTTP server and the slots' loop
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
