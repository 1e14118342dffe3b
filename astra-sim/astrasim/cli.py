"""The ``astra-sim`` executable.

One-shot (upstream ASTRA-Sim flags)::

    astra-sim --workload-configuration=PREFIX --system-configuration=sys.json \
              --network-configuration=network.yml --remote-memory-configuration=mem.json

runs ``PREFIX.<i>.et`` for every NPU i of the network and prints per NPU
``sys[i] finished, C cycles, exposed communication E cycles.``

Interactive (``--interactive``, or no --workload-configuration): prints a line containing
``Waiting``, then reads one command per stdin line:

* a workload prefix: runs ``<prefix>.<i>.et`` for every NPU whose file exists, as one
  iteration starting at cycle 0, prints ``sys[i] iteration M finished, C cycles,
  exposed communication E cycles.`` per NPU that ran, then ``Waiting`` again;
* ``pass``: no iteration; prints ``Waiting`` again;
* ``done``: prints the per-NPU totals over all iterations (``sys[i] finished, ...``) and
  exits 0;  ``exit``: exits 0;  end of input: exits 0. Blank lines are ignored.

User errors (bad flags, files, commands, traces) print one ``astra-sim: error: ...``
line on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys

from astrasim.config import ConfigError, MemoryConfig, Network, SystemConfig
from astrasim.engine import Engine, WorkloadError
from astrasim.et import EtFormatError, read_workload

WAITING = "Waiting for the next workload (a trace prefix, pass, done or exit)"


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (raised, handled in main)
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="astra-sim", add_help=True,
                description="ASTRA-Sim-compatible analytical system simulator (pure Python)")
    p.add_argument("--workload-configuration", dest="workload")
    p.add_argument("--system-configuration", dest="system")
    p.add_argument("--network-configuration", dest="network")
    p.add_argument("--remote-memory-configuration", "--memory-configuration", dest="memory")
    p.add_argument("--comm-group-configuration", dest="comm_group",
                   help="accepted for compatibility; communicator groups follow involved_dim")
    p.add_argument("--logging-configuration", dest="logging", help="accepted, ignored")
    p.add_argument("--logging-folder", dest="logging_folder", help="accepted, ignored")
    p.add_argument("--interactive", action="store_true",
                   help="serve workloads read from stdin (see the module docstring)")
    return p


def _report(out, results, iteration=None) -> None:
    for npu in sorted(results):
        r = results[npu]
        if iteration is None:
            out.write(f"sys[{npu}] finished, {r.cycles} cycles, exposed communication "
                      f"{r.exposed_comm_cycles} cycles.\n")
        else:
            out.write(f"sys[{npu}] iteration {iteration} finished, {r.cycles} cycles, "
                      f"exposed communication {r.exposed_comm_cycles} cycles.\n")


_CACHE: dict = {}  # trace bytes -> parsed Graph, shared by the iterations of one process
_CACHE_MAX = 256


def _run_prefix(engine: Engine, prefix: str, *, required: bool):
    if len(_CACHE) > _CACHE_MAX:
        _CACHE.clear()
    graphs = read_workload(prefix, range(engine.network.num_npus), required=required,
                           cache=_CACHE)
    if not graphs:
        raise EtFormatError(f"no trace files {prefix}.<npu>.et found for NPUs "
                            f"0..{engine.network.num_npus - 1}")
    try:
        return engine.run(graphs)
    except WorkloadError as e:  # name the traces: the engine knows only NPU numbers
        raise WorkloadError(f"{prefix}.<npu>.et: {e}") from None


def _interactive(engine: Engine, initial: str | None, stdin, out) -> int:
    totals: dict[int, list[int]] = {}
    iteration = 0

    def one(prefix):
        nonlocal iteration
        try:
            res = _run_prefix(engine, prefix, required=False)
        except EtFormatError as e:
            if "no trace files" in str(e):
                raise UsageError(f"unknown command {prefix!r}: not pass, done or exit, and "
                                 f"no trace files {prefix}.<npu>.et exist") from None
            raise
        _report(out, res, iteration)
        iteration += 1
        for npu, r in res.items():
            t = totals.setdefault(npu, [0, 0])
            t[0] += r.cycles
            t[1] += r.exposed_comm_cycles

    if initial:
        one(initial)
    while True:
        out.write(WAITING + "\n")
        out.flush()
        while True:
            line = stdin.readline()
            if not line:
                return 0
            cmd = line.strip()
            if cmd:
                break
        if cmd == "exit":
            return 0
        if cmd == "done":
            for npu in sorted(totals):
                c, e = totals[npu]
                out.write(f"sys[{npu}] finished, {c} cycles, exposed communication {e} "
                          f"cycles.\n")
            out.flush()
            return 0
        if cmd == "pass":
            continue
        one(cmd)


def main(argv=None) -> int:
    out = sys.stdout
    try:
        args = _parser().parse_args(argv)
        if not args.network:
            raise UsageError("--network-configuration is required")
        network = Network.load(args.network)
        system = SystemConfig.load(args.system) if args.system else SystemConfig()
        memory = MemoryConfig.load(args.memory) if args.memory else MemoryConfig()
        engine = Engine(network, system, memory)
        if args.interactive or not args.workload:
            return _interactive(engine, args.workload, sys.stdin, out)
        res = _run_prefix(engine, args.workload, required=True)
        _report(out, res)
        out.flush()
        return 0
    except (UsageError, ConfigError, EtFormatError, WorkloadError) as e:
        msg = " ".join(str(e).split())
        sys.stderr.write(f"astra-sim: error: {msg}\n")
        sys.stderr.flush()
        return 2
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
