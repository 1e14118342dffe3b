"""The astra-sim executable: one-shot and interactive modes, user errors."""

from __future__ import annotations

import json
import subprocess
import sys

if getattr(sys.modules.get("astrasim"), "__file__", "") is None:
    del sys.modules["astrasim"]

import pytest
from astrasim import CollectiveCommType as CT
from astrasim import Engine, GraphBuilder, MemoryConfig, Network, SystemConfig, write_workload

MiB = 1 << 20
NET = "topology: [ Ring, Switch ]\nnpus_count: [ 2, 2 ]\nbandwidth: [ 100.0, 25.0 ]\nlatency: [ 300.0, 900.0 ]\n"
SYS = {"scheduling-policy": "LIFO", "endpoint-delay": 10, "active-chunks-per-dimension": 1,
       "preferred-dataset-splits": 1, "all-reduce-implementation": ["ring", "ring"],
       "all-gather-implementation": ["ring", "ring"],
       "reduce-scatter-implementation": ["ring", "ring"],
       "all-to-all-implementation": ["ring", "ring"], "collective-optimization": "localBWAware",
       "local-mem-bw": 1600}


def cmd(*args):
    return [sys.executable, "-m", "astrasim", *args]


@pytest.fixture
def cfg(tmp_path):
    (tmp_path / "network.yml").write_text(NET)
    (tmp_path / "system.json").write_text(json.dumps(SYS))
    (tmp_path / "mem.json").write_text('{"memory-type": "NO_MEMORY_EXPANSION"}')
    e = Engine(Network.load(tmp_path / "network.yml"), SystemConfig.from_dict(SYS),
               MemoryConfig())
    return tmp_path, e


def flags(d):
    return [f"--system-configuration={d / 'system.json'}",
            f"--network-configuration={d / 'network.yml'}",
            f"--remote-memory-configuration={d / 'mem.json'}"]


def tp_graphs(comp_ns, size, npus):
    b = GraphBuilder()
    b.comp(comp_ns)
    b.all_reduce(size, involved_dim=[True, False])
    b.comp(comp_ns)
    g = b.build()
    return {i: g.copy_for(i) for i in npus}


def test_one_shot(cfg):
    d, e = cfg
    write_workload(d / "wl" / "iter", tp_graphs(1000, MiB, range(4)))
    T = e.collective_time(CT.ALL_REDUCE, MiB, [True, False])
    p = subprocess.run(cmd(f"--workload-configuration={d / 'wl' / 'iter'}", *flags(d)),
                       capture_output=True, text=True, timeout=30,
                       check=False)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert lines == [f"sys[{i}] finished, {2000 + T} cycles, exposed communication {T} cycles."
                     for i in range(4)]


def test_one_shot_space_separated_flags(cfg):
    d, _ = cfg
    write_workload(d / "w", tp_graphs(5, 4096, range(4)))
    args = ["--workload-configuration", str(d / "w"),
            "--system-configuration", str(d / "system.json"),
            "--network-configuration", str(d / "network.yml")]
    p = subprocess.run(cmd(*args), capture_output=True, text=True, timeout=30,
                       check=False)
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.splitlines()) == 4


def read_until_waiting(proc):
    out = []
    while True:
        line = proc.stdout.readline()
        assert line, "process ended before Waiting"
        if "Waiting" in line:
            return out
        out.append(line.rstrip("\n"))


def test_interactive_protocol(cfg):
    d, e = cfg
    write_workload(d / "a", tp_graphs(1000, MiB, [0, 1]))        # TP2 on NPUs 0,1 only
    write_workload(d / "b", tp_graphs(500, 2 * MiB, range(4)))
    Ta = e.collective_time(CT.ALL_REDUCE, MiB, [True, False])
    Tb = e.collective_time(CT.ALL_REDUCE, 2 * MiB, [True, False])
    proc = subprocess.Popen(cmd(*flags(d)), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, bufsize=1)
    try:
        assert read_until_waiting(proc) == []
        proc.stdin.write(f"{d / 'a'}\n")
        proc.stdin.flush()
        assert read_until_waiting(proc) == [
            f"sys[{i}] iteration 0 finished, {2000 + Ta} cycles, exposed communication {Ta} cycles."
            for i in (0, 1)]
        proc.stdin.write("pass\n")
        proc.stdin.flush()
        assert read_until_waiting(proc) == []
        proc.stdin.write(f"{d / 'b'}\n")
        proc.stdin.flush()
        assert read_until_waiting(proc) == [
            f"sys[{i}] iteration 1 finished, {1000 + Tb} cycles, exposed communication {Tb} cycles."
            for i in range(4)]
        proc.stdin.write(f"{d / 'a'}\n")
        proc.stdin.flush()
        lines = read_until_waiting(proc)
        assert lines[0].startswith("sys[0] iteration 2 finished, ")
        proc.stdin.write("done\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    totals = out.strip().splitlines()
    assert totals[0] == (f"sys[0] finished, {2 * (2000 + Ta) + 1000 + Tb} cycles, "
                         f"exposed communication {2 * Ta + Tb} cycles.")
    assert totals[3] == f"sys[3] finished, {1000 + Tb} cycles, exposed communication {Tb} cycles."


def test_interactive_eof_and_exit(cfg):
    d, _ = cfg
    for stdin in ("", "exit\n", "pass\n\n"):
        p = subprocess.run(cmd(*flags(d), "--interactive"), input=stdin, capture_output=True,
                           text=True, timeout=30, check=False)
        assert p.returncode == 0, p.stderr
        assert "Waiting" in p.stdout


def test_interactive_unknown_command(cfg):
    d, _ = cfg
    p = subprocess.run(cmd(*flags(d)), input="frobnicate\n", capture_output=True, text=True,
                       timeout=30, check=False)
    assert p.returncode == 2
    assert "frobnicate" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("case", ["bad_flag", "no_network", "bad_network", "mismatch",
                                  "missing_et", "garbled_et", "bad_system"])
def test_user_errors_exit_2(cfg, case):
    d, _ = cfg
    args = flags(d)
    write_workload(d / "ok", tp_graphs(10, 4096, range(4)))
    wl = f"--workload-configuration={d / 'ok'}"
    expect = None
    if case == "bad_flag":
        args, expect = ["--frobnicate"], "frobnicate"
    elif case == "no_network":
        args, expect = [wl], "--network-configuration"
    elif case == "bad_network":
        (d / "network.yml").write_text("topology: [Ring]\nnpus_count: [4]\n")
        args, expect = [wl, *args], "bandwidth"
    elif case == "mismatch":
        (d / "network.yml").write_text(NET.replace("[ 2, 2 ]", "[ 2, 2, 2 ]"))
        args, expect = [wl, *args], "npus_count"
    elif case == "missing_et":
        write_workload(d / "part", tp_graphs(10, 4096, range(3)))
        args, expect = [f"--workload-configuration={d / 'part'}", *args], "part.3.et"
    elif case == "garbled_et":
        (d / "ok.2.et").write_bytes((d / "ok.2.et").read_bytes()[:-3])
        args, expect = [wl, *args], "ok.2.et"
    elif case == "bad_system":
        (d / "system.json").write_text('{"endpoint-delay": -1}')
        args, expect = [wl, *args], "endpoint-delay"
    p = subprocess.run(cmd(*args), capture_output=True, text=True, timeout=30,
                       check=False)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert expect in p.stderr
    assert "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
