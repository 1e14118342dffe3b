"""The PyTorch profiler: a tiny CPU run writes a bundle in LLMServingSim's format."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from sim.errors import InputError
from sim.model import BLOCK_SEQUENCES, HEAD_DENSE, HEAD_PER_SEQUENCE, PROLOGUE, ModelSpec

torch = pytest.importorskip("torch")

from sim.profiler import ProfileGrid, profile_bundle  # noqa: E402 - needs torch first

TINY_LLAMA = ModelSpec(name="test-org/Tiny-Llama", architecture="llama", hidden_size=256,
                       num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                       head_dim=32, intermediate_size=512, vocab_size=2048)
TINY_MOE = ModelSpec(name="test-org/Tiny-Qwen3-MoE", architecture="qwen3_moe", hidden_size=128,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=32, intermediate_size=256, vocab_size=1024, num_experts=8,
                     num_experts_per_tok=2, moe_intermediate_size=64)
GRID = ProfileGrid(tokens=(1, 8, 32, 128, 512), sequences=(1, 4, 16), chunks=(0, 16, 64),
                   n_decode=(0, 1, 4), kv=(0, 16, 128), moe_tokens=(1, 4, 32))


def _rows(path: Path) -> tuple[list[str], list[dict]]:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


@pytest.fixture(scope="module")
def llama_bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundles")
    torch.manual_seed(0)
    # One intra-op thread: on a shared 2-core machine, torch's thread pool waiting for a
    # busy core costs milliseconds per call and drowns the tiny kernels being timed.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return profile_bundle(TINY_LLAMA, "CPU-TEST", out, tp_degrees=(1, 2), device="cpu",
                              grid=GRID, iterations=5, warmup=2, tiny=True)
    finally:
        torch.set_num_threads(threads)


def test_bundle_layout_and_meta(llama_bundle: Path):
    assert llama_bundle.parts[-4:] == ("CPU-TEST", "test-org", "Tiny-Llama", "bf16")
    meta = yaml.safe_load((llama_bundle / "meta.yaml").read_text())
    for key in ("profiler_version", "hardware", "model", "variant", "tp_degrees", "gpu",
                "torch_version", "measurement_iterations", "attention_grid"):
        assert key in meta, key
    assert meta["device"] == "cpu" and meta["tiny_shapes"] is True
    assert meta["tp_degrees"] == [1, 2] and meta["measurement_iterations"] == 5
    assert meta["model"] == TINY_LLAMA.name and meta["hardware"] == "CPU-TEST"
    for tp in (1, 2):
        d = llama_bundle / f"tp{tp}"
        assert {p.name for p in d.iterdir()} == {"dense.csv", "per_sequence.csv", "attention.csv"}


def test_csv_columns_layers_and_positive_times(llama_bundle: Path):
    d = llama_bundle / "tp1"
    cols, dense = _rows(d / "dense.csv")
    assert cols == ["layer", "tokens", "time_us"]
    needed = {*PROLOGUE, *HEAD_DENSE, *BLOCK_SEQUENCES["llama"]} - {"attention"}
    assert {r["layer"] for r in dense} == needed
    assert {int(r["tokens"]) for r in dense} == set(GRID.tokens)
    cols, seq = _rows(d / "per_sequence.csv")
    assert cols == ["layer", "sequences", "time_us"]
    assert {r["layer"] for r in seq} == set(HEAD_PER_SEQUENCE)
    cols, attn = _rows(d / "attention.csv")
    assert cols == ["prefill_chunk", "kv_prefill", "n_decode", "kv_decode", "time_us"]
    assert len(attn) == len(GRID.attention_points())
    for r in attn:
        pc, kp, nd, kd = (int(r[c]) for c in cols[:4])
        assert pc or nd
        assert kp == 0 if pc == 0 else True
        assert (kd == 0) == (nd == 0)
    for r in dense + seq + attn:
        assert float(r["time_us"]) > 0


def test_dense_time_grows_with_tokens(llama_bundle: Path):
    _, dense = _rows(llama_bundle / "tp1" / "dense.csv")
    by_tokens: dict[int, float] = {}
    for r in dense:
        if r["layer"] in ("qkv_proj", "gate_up_proj", "down_proj", "o_proj"):
            by_tokens[int(r["tokens"])] = by_tokens.get(int(r["tokens"]), 0.0) + float(r["time_us"])
    ts = sorted(by_tokens)
    small = sum(by_tokens[t] for t in ts[:2]) / 2
    large = sum(by_tokens[t] for t in ts[-2:]) / 2
    assert large > small


def test_moe_bundle(tmp_path: Path):
    root = profile_bundle(TINY_MOE, "CPU-TEST", tmp_path, device="cpu", grid=GRID,
                          iterations=2, warmup=1, tiny=True)
    cols, moe = _rows(root / "tp1" / "moe.csv")
    assert cols == ["tokens", "activated_experts", "time_us"]
    pts = {(int(r["tokens"]), int(r["activated_experts"])) for r in moe}
    assert (1, 2) in pts and (32, 8) in pts
    assert all(a <= min(8, t * 2) for t, a in pts)
    assert all(float(r["time_us"]) > 0 for r in moe)
    _, dense = _rows(root / "tp1" / "dense.csv")
    assert "qk_norm" in {r["layer"] for r in dense}
    assert "gate_up_proj" not in {r["layer"] for r in dense}


def test_bad_inputs(tmp_path: Path):
    with pytest.raises(InputError, match="tp_size=3"):
        profile_bundle(TINY_LLAMA, "CPU-TEST", tmp_path, tp_degrees=(3,), device="cpu", tiny=True)
    with pytest.raises(InputError, match="device"):
        profile_bundle(TINY_LLAMA, "CPU-TEST", tmp_path, device="tpu", tiny=True)
    with pytest.raises(InputError, match="grid"):
        profile_bundle(TINY_LLAMA, "CPU-TEST", tmp_path, device="cpu",
                       grid=ProfileGrid(tokens=()))
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="CUDA"):
            profile_bundle(TINY_LLAMA, "CPU-TEST", tmp_path, device="cuda", tiny=True)


def test_missing_torch_is_an_input_error(monkeypatch, tmp_path: Path):
    import builtins

    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("no torch")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(InputError, match=r"pip install '\.\[profile\]'"):
        profile_bundle(TINY_LLAMA, "CPU-TEST", tmp_path, device="cpu", tiny=True)


def test_measured_provider_loads_profiled_bundle_and_simulation_runs(llama_bundle: Path,
                                                                      tmp_path: Path):
    import json

    import sim

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({
        "_name_or_path": TINY_LLAMA.name, "model_type": "llama",
        "hidden_size": TINY_LLAMA.hidden_size, "num_hidden_layers": TINY_LLAMA.num_hidden_layers,
        "num_attention_heads": TINY_LLAMA.num_attention_heads,
        "num_key_value_heads": TINY_LLAMA.num_key_value_heads, "head_dim": TINY_LLAMA.head_dim,
        "intermediate_size": TINY_LLAMA.intermediate_size, "vocab_size": TINY_LLAMA.vocab_size,
        "torch_dtype": "bfloat16"}))
    cluster = sim.parse_cluster({"num_nodes": 1, "link_bw": 16, "link_latency": 1000, "nodes": [{
        "num_instances": 1, "cpu_mem": {"mem_size": 8, "mem_bw": 50, "mem_latency": 0},
        "instances": [{"model_name": str(cfg), "hardware": "CPU-TEST",
                       "npu_mem": {"mem_size": 1, "mem_bw": 100, "mem_latency": 0},
                       "num_npus": 1, "tp_size": 1}]}]})
    wl = sim.generate(sim.WorkloadSpec(num_requests=20, rate=50.0,
                                       input=sim.LengthDist("uniform", low=8, high=100),
                                       output=sim.LengthDist("uniform", low=2, high=20), seed=3))
    opts = sim.SimOptions(latency_provider="measured",
                          profiles_dirs=(str(llama_bundle.parents[3]),))
    res = sim.simulate(cluster, wl, opts)
    assert res.summary["latency_provider"] == "measured"
    assert res.summary["latency_source"]["0"] == str(llama_bundle)
    assert res.summary["num_finished"] == 20
    table = res.requests_table()
    assert (table["ttft_ns"] > 0).all() and (table["output_tokens"] == [
        r.output_len for r in sorted(wl.all_requests(), key=lambda r: r.rid)]).all()


class _FakeCuda:
    """Just enough of ``torch.cuda`` to run ``_Timer``'s CUDA path on a simulated GPU:
    a call costs ``kernel_us`` of GPU time, and launched alone (not from a graph) the GPU
    also waits ``launch_us`` for the host first; events read the simulated clock."""

    def __init__(self, kernel_us: float, launch_us: float, capturable: bool = True) -> None:
        self.kernel_us, self.launch_us, self.capturable = kernel_us, launch_us, capturable
        self.clock_us = 0.0
        self.capturing: list | None = None
        cuda = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.t = None

            def record(self) -> None:
                self.t = cuda.clock_us

            def synchronize(self) -> None:
                pass

            def elapsed_time(self, end) -> float:
                return (end.t - self.t) / 1e3  # ms

        class CUDAGraph:
            def __init__(self) -> None:
                self.calls = 0

            def replay(self) -> None:
                cuda.clock_us += self.calls * cuda.kernel_us

        class _Graph:
            def __init__(self, graph) -> None:
                self.graph = graph

            def __enter__(self):
                cuda.capturing = []
                return self

            def __exit__(self, *exc):
                calls, cuda.capturing = cuda.capturing, None
                if exc[0] is None:
                    if not cuda.capturable:
                        raise RuntimeError("operation not permitted when stream is capturing")
                    self.graph.calls = len(calls)
                return False

        class _Stream:
            def wait_stream(self, other) -> None:
                pass

        class _On:
            def __init__(self, stream) -> None:
                pass

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        self.Event, self.CUDAGraph = Event, CUDAGraph
        self.graph, self.Stream, self.stream = _Graph, _Stream, _On
        self.current_stream = _Stream

    def synchronize(self) -> None:
        pass

    def call(self) -> None:
        """The function being timed."""
        if self.capturing is not None:
            self.capturing.append(1)
        else:
            self.clock_us += self.launch_us + self.kernel_us


@pytest.mark.parametrize("capturable", [True, False])
def test_cuda_timer_reports_gpu_time_without_launch_latency(capturable):
    """On CUDA a sample is a CUDA graph of the call repeated (the GPU's own time, as vLLM's
    graphs and busy steps run it); a call timed alone between two events would include
    the host's launch latency (what made profiled steps 1.3-3.2x vLLM's). A call that
    cannot be captured is timed over the same repeats eagerly, and counted."""
    from types import SimpleNamespace

    from sim.profiler import _Timer

    cuda = _FakeCuda(kernel_us=4.0, launch_us=20.0, capturable=capturable)
    timer = _Timer(SimpleNamespace(cuda=cuda), SimpleNamespace(type="cuda"), iterations=3,
                   warmup=1)
    us = timer(cuda.call)
    if capturable:
        assert us == pytest.approx(4.0) and timer.uncaptured == 0
    else:
        assert us == pytest.approx(24.0) and timer.uncaptured == 1
