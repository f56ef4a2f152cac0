"""``python -m cuda_ipc inspect [--json] [--watch [SECONDS]]``: who holds what on this machine
(``cuda_ipc.inspect()``) as a tree, or as JSON; ``--watch`` refreshes it until interrupted."""

import argparse
import sys
import time

from . import _native


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cuda_ipc")
    sub = parser.add_subparsers(dest="command", required=True)
    inspect = sub.add_parser("inspect", help="who holds what: exporters, importers, deferred frees, channels")
    inspect.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    inspect.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=float,
        metavar="SECONDS",
        help="refresh every SECONDS (2), until interrupted, saying how long each channel has made no progress",
    )
    args = parser.parse_args(argv)
    if args.watch is not None and not 0 < args.watch <= 3600:
        parser.error("--watch takes 0 < SECONDS <= 3600")
    watch = _native.InspectWatch() if args.watch is not None else None
    try:
        while True:
            text, js = watch.snapshot() if watch is not None else _native.inspect_snapshot()
            if args.json:
                print(js, flush=True)
            else:
                if args.watch is not None:
                    print("\x1b[2J\x1b[H", end="")
                print(text, end="", flush=True)
            if args.watch is None:
                return 0
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
