"""Malformed input reaching ``llmsim`` (run, bench, compare), ``astra-sim`` and
``experiments/validate_vllm.py`` through the files they read besides the cluster file: a
model's HF ``config.json``, profile bundles (meta.yaml, CSVs), PIM ``.ini`` files, benchmark
results, workload JSONL. Each case exits 2 with one line naming the file (and line, column
or field) and what is allowed, never a traceback, and nothing is simulated first.

Hypothesis mutates valid examples (drop a field, give it another type, truncate, insert
garbage bytes) and asserts the contract: success or exit 2 with one line, never exit 1.
Every table row was a traceback (exit 1) or a silent default before the fixes it names.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_testkit import cluster_dict, make_bundle

import sim
from sim.cli import main

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
REPO = Path(__file__).resolve().parents[2]
# A Hugging Face config.json as LLMServingSim ships it (Qwen3-32B), written here so the
# test does not need ../shared.
HF = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 5120,
      "num_hidden_layers": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
      "head_dim": 128, "intermediate_size": 25600, "vocab_size": 151936,
      "max_position_embeddings": 40960, "tie_word_embeddings": False,
      "torch_dtype": "bfloat16"}
GOOD_PIM = """[dram_structure]
protocol = HBM
bankgroups = 4
banks_per_group = 4
rows = 32768
columns = 64
device_width = 128
BL = 4

[timing]
tCK = 1.0
CL = 14
tRCD = 14
tRP = 14

[system]
channel_size = 1024
channels = 8
bus_width = 128
"""


def _no_simulation(*a, **k):
    raise AssertionError("sim.simulate was called: the input was not checked first")


def assert_one_line(capsys, rc, prog, needles):
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    for n in needles:
        assert str(n) in lines[0], (n, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    d = tmp_path_factory.mktemp("malformed")
    (d / "w.jsonl").write_text('{"input_toks": 20, "output_toks": 3, "arrival_time_ns": 0}\n')
    (d / "a_file").write_text("x")
    make_bundle(d / "profiles")
    (d / "c.json").write_text(json.dumps(cluster_dict(300)))
    return d


# ----------------------------------------------------------------- model config.json
def _hf(**kw):
    c = copy.deepcopy(HF)
    for k, v in kw.items():
        if v is ...:
            c.pop(k)
        else:
            c[k] = v
    return json.dumps(c).encode()


# (id, the config.json's bytes, needles)
MODEL_CASES = [
    ("not-utf8", b"\xff\xfe{}", ["not UTF-8", "0xff"]),
    ("top-level-list", b"[1, 2]", ["a JSON object", "list"]),
    ("truncated", _hf()[:60], ["malformed JSON", "line 1 column"]),
    ("nested-too-deeply", b"[" * 100000, ["nested too deeply"]),
    ("duplicate-key", b'{"model_type": "qwen3", "model_type": "llama"}',
     ["'model_type' appears twice"]),
    ("model-type-a-list", _hf(model_type=["qwen3"]), ["unknown model_type", "qwen3, qwen3_moe"]),
    ("hidden-size-a-string", _hf(hidden_size="abc"), ["'hidden_size'", "1..2147483647", "'abc'"]),
    ("hidden-size-null", _hf(hidden_size=None), ["'hidden_size' is missing"]),
    ("hidden-size-missing", _hf(hidden_size=...), ["'hidden_size' is missing"]),
    ("hidden-size-fractional", _hf(hidden_size=5120.5), ["'hidden_size'", "5120.5"]),
    ("hidden-size-huge", _hf(hidden_size=10**30), ["'hidden_size'", "1..2147483647"]),
    ("heads-zero", _hf(num_attention_heads=0), ["'num_attention_heads'", "got 0"]),
    ("heads-negative", _hf(num_attention_heads=-8), ["'num_attention_heads'", "got -8"]),
    ("layers-zero", _hf(num_hidden_layers=0), ["'num_hidden_layers'", "got 0"]),
    ("vocab-a-list", _hf(vocab_size=[1]), ["'vocab_size'", "[1]"]),
    ("kv-heads-zero", _hf(num_key_value_heads=0), ["'num_key_value_heads'", "got 0"]),
    ("kv-heads-not-dividing", _hf(num_key_value_heads=7), ["not a multiple", "=7"]),
    ("head-dim-negative", _hf(head_dim=-1), ["'head_dim'", "got -1"]),
    ("experts-a-string", _hf(num_experts="x"), ["'num_experts'", "'x'"]),
    ("tie-a-string", _hf(tie_word_embeddings="no"), ["'tie_word_embeddings'", "true or false"]),
    ("max-positions-negative", _hf(max_position_embeddings=-5),
     ["'max_position_embeddings'", "got -5"]),
    ("quant-groups-a-list", _hf(quantization_config={"quant_method": "compressed-tensors",
                                                     "config_groups": [1]}),
     ["quantization_config", "not modelled"]),
    ("quant-weights-a-list", _hf(quantization_config={
        "quant_method": "compressed-tensors", "config_groups": {"g": {"weights": [8]}}}),
     ["quantization_config", "not modelled"]),
    ("modelopt-quantization-a-string", _hf(quantization_config={
        "quant_method": "modelopt", "quantization": "x"}), ["quantization_config"]),
]


@pytest.mark.parametrize("data,needles", [c[1:] for c in MODEL_CASES],
                         ids=[c[0] for c in MODEL_CASES])
def test_model_config_refused(d, data, needles, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sim, "simulate", _no_simulation)
    cfg = tmp_path / "config.json"
    cfg.write_bytes(data)
    c = cluster_dict(300, hardware="H100-SXM")
    c["nodes"][0]["instances"][0]["model_name"] = str(cfg)
    (tmp_path / "c.json").write_text(json.dumps(c))
    rc = main(["run", "--cluster", str(tmp_path / "c.json"), "--dataset", str(d / "w.jsonl"),
               "--output", str(tmp_path / "o.csv")])
    assert_one_line(capsys, rc, "llmsim", [str(cfg), *needles])


def test_good_model_config_still_loads(tmp_path):
    (tmp_path / "config.json").write_bytes(_hf())
    from sim.model import load_model

    spec = load_model(str(tmp_path / "config.json"))
    assert (spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim) == (64, 8, 128)
    assert spec.tie_word_embeddings is False


# A catalogue entry (profiles/models/*.yaml): a misspelt optional field was ignored (here
# num_key_value_head: the KV heads defaulted to the attention heads, 4x the KV cache), and
# aliases given as {}, false, 0 or "" read as none.
@pytest.mark.parametrize("change,needles", [
    ({"num_key_value_head": 8}, ["unknown field 'num_key_value_head'", "num_key_value_heads",
                                 "weight_block_size"]),
    ({"aliases": {}}, ["'aliases' must be a list of names", "{}"]),
    ({"aliases": False}, ["'aliases' must be a list of names", "False"]),
    ({"aliases": ""}, ["'aliases' must be a list of names"]),
], ids=["misspelt-field", "aliases-a-mapping", "aliases-false", "aliases-empty-string"])
def test_model_catalogue_entry_refused(change, needles):
    from sim.model import _from_mapping

    spec = yaml.safe_load((REPO / "profiles/models/Llama-3.1-8B.yaml").read_text())
    with pytest.raises(sim.InputError) as exc:
        _from_mapping({**spec, **change}, "m.yaml")
    msg = str(exc.value)
    assert msg.startswith("m.yaml: ") and "\n" not in msg, msg
    for n in needles:
        assert n in msg, (n, msg)


# ------------------------------------------------------------------- profile bundles
def _edit(name, fn):
    def m(v):
        p = v / name
        p.write_text(fn(p.read_text()))
    return m


def _raw(name, data):
    return lambda v: (v / name).write_bytes(data)


# (id, mutation of the bundle's variant folder, needles)
BUNDLE_CASES = [
    ("meta-not-utf8", _raw("meta.yaml", b"\xff\xfe: x"), ["meta.yaml", "not UTF-8"]),
    ("meta-a-list", _raw("meta.yaml", b"- 1\n- 2\n"), ["meta.yaml", "a mapping", "list"]),
    ("meta-tab", _raw("meta.yaml", b"hardware:\tX\n\tmodel: y\n"),
     ["meta.yaml", "malformed YAML", "line 2, column 1"]),
    ("meta-duplicate-key", _raw("meta.yaml", b"model: a\nmodel: b\n"),
     ["meta.yaml", "'model' appears twice"]),
    ("meta-skew-fit-a-number", _edit("meta.yaml", lambda t: t + "skew_fit: 7\n"),
     ["meta.yaml", "'skew_fit' must be a mapping"]),
    ("meta-skew-axes-bad", _edit("meta.yaml", lambda t: t + yaml.safe_dump({"skew_fit": {
        "enabled": True, "per_tp": {1: {"alpha_default": 0.5}},
        "bucket_axes": {f"{a}_{k}": [1] for a in ("n", "skew_rate", "kv_big", "kp")
                        for k in ("bins", "labels")}}})),
     ["meta.yaml", "n_bins must be increasing numbers"]),
    ("dense-not-utf8", _raw("tp1/dense.csv", b"layer,tokens,time_us\n\xff,1,2\n"),
     ["dense.csv", "not UTF-8"]),
    ("dense-time-nan", _edit("tp1/dense.csv", lambda t: t.replace(",1.001\n", ",nan\n")),
     ["dense.csv", "line 2", "'time_us'", "finite time >= 0"]),
    ("dense-time-inf", _edit("tp1/dense.csv", lambda t: t.replace(",1.001\n", ",inf\n")),
     ["dense.csv", "line 2", "'time_us'"]),
    ("dense-time-negative", _edit("tp1/dense.csv", lambda t: t.replace(",1.001\n", ",-5\n")),
     ["dense.csv", "line 2", "'time_us'", "'-5'"]),
    ("dense-tokens-negative", _edit("tp1/dense.csv", lambda t: t.replace(
        "\nembedding,1,", "\nembedding,-1,")), ["dense.csv", "'tokens'", "integer >= 0"]),
    ("dense-tokens-fractional", _edit("tp1/dense.csv", lambda t: t.replace(
        "\nembedding,1,", "\nembedding,1.5,")), ["dense.csv", "'tokens'", "'1.5'"]),
    ("dense-tokens-1e300", _edit("tp1/dense.csv", lambda t: t.replace(
        "\nembedding,1,", "\nembedding,1e300,")), ["dense.csv", "'tokens'"]),
    ("dense-tokens-nan", _edit("tp1/dense.csv", lambda t: t.replace(
        "\nembedding,1,", "\nembedding,nan,")), ["dense.csv", "'tokens'"]),
    ("per-sequence-time-nan", _edit("tp1/per_sequence.csv", lambda t: t.replace(
        "lm_head,1,2.01", "lm_head,1,nan")), ["per_sequence.csv", "'time_us'"]),
    ("attention-time-nan", _edit("tp1/attention.csv", lambda t: t.replace(
        "\n0,0,0,0,2.0\n", "\n0,0,0,0,nan\n")), ["attention.csv", "line 2", "'time_us'"]),
    ("attention-time-negative", _edit("tp1/attention.csv", lambda t: t.replace(
        "\n0,0,0,0,2.0\n", "\n0,0,0,0,-2.0\n")), ["attention.csv", "'time_us'"]),
    ("attention-key-negative", _edit("tp1/attention.csv", lambda t: t.replace(
        "\n0,0,0,0,2.0\n", "\n-5,0,0,0,2.0\n")), ["attention.csv", "'prefill_chunk'"]),
]


@pytest.mark.parametrize("mutate,needles", [c[1:] for c in BUNDLE_CASES],
                         ids=[c[0] for c in BUNDLE_CASES])
def test_profile_bundle_refused(d, mutate, needles, capsys, tmp_path):
    # (bundles are read when the simulation builds its latency provider, before any step)
    variant = make_bundle(tmp_path / "profiles")
    mutate(variant)
    rc = main(["run", "--cluster", str(d / "c.json"), "--dataset", str(d / "w.jsonl"),
               "--output", str(tmp_path / "o.csv"), "--profiles", str(tmp_path / "profiles"),
               "--latency-provider", "measured"])
    assert_one_line(capsys, rc, "llmsim", needles)


def test_good_bundle_still_runs(d, capsys, tmp_path):
    rc = main(["run", "--cluster", str(d / "c.json"), "--dataset", str(d / "w.jsonl"),
               "--output", str(tmp_path / "o.csv"), "--profiles", str(d / "profiles"),
               "--latency-provider", "measured"])
    assert rc == 0, capsys.readouterr().err


# ------------------------------------------------------------------------- PIM .ini
PIM_CASES = [
    ("not-utf8", b"\xff\xfe[system]\n", ["not UTF-8"]),
    ("tck-nan", GOOD_PIM.replace("tCK = 1.0", "tCK = nan").encode(),
     ["[timing] tCK", "finite number", "'nan'"]),
    ("tck-inf", GOOD_PIM.replace("tCK = 1.0", "tCK = inf").encode(), ["[timing] tCK"]),
    ("channels-inf", GOOD_PIM.replace("channels = 8", "channels = inf").encode(),
     ["[system] channels", "an integer", "'inf'"]),
    ("channels-1e400", GOOD_PIM.replace("channels = 8", "channels = 1e400").encode(),
     ["[system] channels", "an integer"]),
    ("channels-fractional", GOOD_PIM.replace("channels = 8", "channels = 1.5").encode(),
     ["[system] channels", "'1.5'"]),
    ("key-twice", GOOD_PIM.replace("[timing]\n", "[timing]\ntCK = 2\n").encode(),
     ["malformed PIM config", "already exists"]),
    # finite but absurd: the device's bandwidth and row sizes overflowed a float in the
    # first attention step (ZeroDivisionError / OverflowError tracebacks)
    ("tck-1e308", GOOD_PIM.replace("tCK = 1.0", "tCK = 1e308").encode(),
     ["[timing] tCK", "at most 1e15", "'1e308'"]),
    ("columns-1e308", GOOD_PIM.replace("columns = 64", "columns = 1e308").encode(),
     ["[dram_structure] columns", "at most 1e15"]),
    ("channels-2-64", GOOD_PIM.replace("channels = 8", f"channels = {2**64}").encode(),
     ["[system] channels", "at most 1e15", str(2**64)]),
    ("tccd-l-1e308", GOOD_PIM.replace("tRP = 14", "tRP = 14\ntCCD_L = 1e308").encode(),
     ["[timing] tCCD_L", "at most 1e15"]),
]


@pytest.mark.parametrize("data,needles", [c[1:] for c in PIM_CASES],
                         ids=[c[0] for c in PIM_CASES])
def test_pim_config_refused(tmp_path, data, needles):
    from sim.pim import load_pim

    p = tmp_path / "dev.ini"
    p.write_bytes(data)
    with pytest.raises(sim.InputError) as exc:
        load_pim(str(p))
    msg = str(exc.value)
    assert "\n" not in msg and str(p) in msg
    for n in needles:
        assert n in msg, (n, msg)


def test_good_pim_config_loads(tmp_path):
    from sim.pim import load_pim

    (tmp_path / "dev.ini").write_text(GOOD_PIM)
    dev = load_pim(str(tmp_path / "dev.ini"))
    assert (dev.channels, dev.tCK_ns) == (8, 1.0)


# LLMServingSim reads cpu_mem.pim_config only with attention offloading on
# (inference_serving/config_builder.py builds its PIMModel in that branch), so the .ini is
# parsed only then; but a name that is no file and no known device is a mistake whatever the
# flags: refused at load (it was accepted silently without --enable-attn-offloading).
PIM_NAME_CASES = [
    ("missing-path", lambda t: str(t / "nope" / "dev.ini"), ["no such file", "DDR4_8GB_3200_pim"]),
    ("a-folder", lambda t: str(t / "adir.ini"), ["is a folder"]),
    ("unknown-name", lambda t: "NoSuchPIM", ["unknown PIM config 'NoSuchPIM'", "HBM2_1GB"]),
]


@pytest.mark.parametrize("offload", [False, True], ids=["offload-off", "offload-on"])
@pytest.mark.parametrize("name,needles", [c[1:] for c in PIM_NAME_CASES],
                         ids=[c[0] for c in PIM_NAME_CASES])
def test_pim_config_naming_no_file_refused_at_load(d, tmp_path, name, needles, offload,
                                                     capsys, monkeypatch):
    monkeypatch.setattr(sim, "simulate", _no_simulation)
    (tmp_path / "adir.ini").mkdir()
    c = cluster_dict(300)
    c["nodes"][0]["cpu_mem"]["pim_config"] = name(tmp_path)
    (tmp_path / "c.json").write_text(json.dumps(c))
    rc = main(["run", "--cluster", str(tmp_path / "c.json"), "--dataset", str(d / "w.jsonl"),
               "--output", str(tmp_path / "o.csv"),
               *(["--enable-attn-offloading"] if offload else [])])
    assert_one_line(capsys, rc, "llmsim", [str(tmp_path / "c.json"),
                                           "nodes[0].cpu_mem.pim_config", *needles])


# A name longer than a file name may be (255 bytes) made the probe for a file of that name
# raise: "llmsim: error: AAAA...: File name too long", naming neither the cluster file, the
# field nor what is allowed (the hardware's: the bundle path it was looked up under).
_LONG = "A" * 300


@pytest.mark.parametrize("edit,needles", [
    (lambda c: c["nodes"][0]["instances"][0].update(model_name=_LONG),
     ["unknown model", "meta-llama/Llama-3.1-8B"]),
    (lambda c: c["nodes"][0]["instances"][0].update(model_name=_LONG + ".json"),
     ["unknown model", "meta-llama/Llama-3.1-8B"]),
    (lambda c: c["nodes"][0]["instances"][0].update(hardware=_LONG),
     ["instance 0", "unknown hardware", "H100-SXM"]),
    (lambda c: c["nodes"][0]["cpu_mem"].update(pim_config=_LONG + ".ini"),
     ["nodes[0].cpu_mem.pim_config", "no such file", "DDR4_8GB_3200_pim"]),
], ids=["model-name", "model-name-json", "hardware", "pim-config-ini"])
def test_name_longer_than_a_file_name_is_unknown(d, tmp_path, edit, needles, capsys):
    # (an unknown hardware is found when the latency provider is built, before any step)
    c = cluster_dict(300)
    edit(c)
    (tmp_path / "c.json").write_text(json.dumps(c))
    rc = main(["run", "--cluster", str(tmp_path / "c.json"), "--dataset", str(d / "w.jsonl"),
               "--output", str(tmp_path / "o.csv")])
    line = assert_one_line(capsys, rc, "llmsim", [str(tmp_path / "c.json"), *needles])
    assert "File name too long" not in line


def test_bench_model_longer_than_a_file_name_is_unknown(capsys, monkeypatch):
    monkeypatch.setattr(sim, "simulate", _no_simulation)
    rc = main(["bench", "--model", _LONG, "--hardware", "H100-SXM", "--num-prompts", "3"])
    line = assert_one_line(capsys, rc, "llmsim", ["--model", "unknown model",
                                                  "meta-llama/Llama-3.1-8B"])
    assert "File name too long" not in line


def test_pim_config_by_name_or_path_still_loads(tmp_path):
    from sim.cluster import load_cluster

    (tmp_path / "dev.ini").write_text(GOOD_PIM)
    for name in ("DDR4_8GB_3200_pim", str(tmp_path / "dev.ini")):
        c = cluster_dict(300)
        c["nodes"][0]["cpu_mem"]["pim_config"] = name
        (tmp_path / "c.json").write_text(json.dumps(c))
        assert load_cluster(tmp_path / "c.json").nodes[0].pim_config == name


# --------------------------------------------------------------------- llmsim compare
_GOOD_RESULT = json.dumps({"mean_ttft_ms": 10.0, "request_throughput": 2.0, "completed": 5})


def _req(**kw):
    return json.dumps({"input_toks": 5, "output_toks": 3, "queued_ts": 0.0,
                       "first_token_ts": 0.1, "last_token_ts": 0.2, **kw})


COMPARE_CASES = [
    ("not-utf8", b"\xff\xfe", ["not UTF-8"]),
    ("nested-too-deeply", b"[" * 100000, ["nested too deeply"]),
    ("metric-a-string", b'{"mean_ttft_ms": "x", "completed": 5}',
     ["'mean_ttft_ms' must be a number", "'x'"]),
    ("metric-a-bool", b'{"mean_ttft_ms": true, "completed": 5}',
     ["'mean_ttft_ms' must be a number", "True"]),
    # a negative or infinite latency, count or throughput was compared as any other value
    ("metric-negative", b'{"mean_ttft_ms": -10.0, "completed": 5}',
     ["'mean_ttft_ms' must be a finite number >= 0", "-10.0"]),
    ("metric-infinity", b'{"mean_ttft_ms": Infinity, "completed": 5}',
     ["'mean_ttft_ms' must be a finite number >= 0", "inf"]),
    ("metric-1e308", b'{"request_throughput": 1e308, "completed": 5}',
     ["'request_throughput' must be a finite number >= 0", "<= 1e15"]),
    ("jsonl-line-2-broken", (_req() + "\n{bad\n").encode(), ["line 2", "malformed JSON"]),
    ("jsonl-bool-count", _req(output_toks=True).encode(), ["line 1", "output_toks"]),
    ("jsonl-nan-timestamp", _req(first_token_ts=float("nan")).encode(),
     ["line 1", "first_token_ts", "finite"]),
    ("jsonl-negative-count", _req(output_toks=-5).encode(), ["line 1", "output_toks", ">= 0"]),
    ("jsonl-huge-timestamp", _req(queued_ts=1e308).encode(), ["line 1", "queued_ts"]),
    ("jsonl-huge-int", _req(output_toks=10**400).encode(), ["line 1", "output_toks"]),
    ("jsonl-out-of-order", _req(first_token_ts=0.5).encode(),
     ["line 1", "first_token_ts <= last_token_ts"]),
]


@pytest.mark.parametrize("data,needles", [c[1:] for c in COMPARE_CASES],
                         ids=[c[0] for c in COMPARE_CASES])
def test_compare_refuses(tmp_path, data, needles, capsys):
    (tmp_path / "sim.json").write_text(_GOOD_RESULT)
    (tmp_path / "real.json").write_bytes(data)
    rc = main(["compare", str(tmp_path / "sim.json"), str(tmp_path / "real.json")])
    assert_one_line(capsys, rc, "llmsim", ["real.json", *needles])


def test_compare_good_jsonl_still_works(tmp_path, capsys):
    (tmp_path / "sim.json").write_text(_GOOD_RESULT)
    (tmp_path / "real.jsonl").write_text(_req() + "\n" + _req(last_token_ts=0.3) + "\n")
    assert main(["compare", str(tmp_path / "sim.json"), str(tmp_path / "real.jsonl")]) == 0


# ----------------------------------------------------------------------- llmsim bench
_BENCH = ["bench", "--model", "meta-llama/Llama-3.1-8B", "--hardware", "H100-SXM",
          "--num-prompts", "3", "--random-input-len", "16", "--random-output-len", "4"]
BENCH_CASES = [
    ("burstiness-nan", ["--request-rate", "5", "--burstiness", "nan"],
     ["--burstiness", "finite number > 0", "nan"]),
    ("burstiness-inf", ["--request-rate", "5", "--burstiness", "inf"], ["--burstiness"]),
    # at the default infinite rate it was ignored (vLLM's get_request asserts it first)
    ("burstiness-negative-at-infinite-rate", ["--burstiness", "-1"],
     ["--burstiness", "finite number > 0", "-1"]),
    ("rate-overflows-the-clock", ["--request-rate", "1e-300"],
     ["--request-rate 1e-300", "146 years"]),
    ("seed-negative", ["--seed", "-1"], ["--seed", ">= 0"]),
    ("output-len-past-int32", ["--random-output-len", str(2**63)],
     ["--random-output-len", "1..2147483647"]),
    ("profiles-missing", ["--profiles", "/nonexistent/profiles"], ["--profiles", "no such folder"]),
    # (was "llmsim: error: /tmp/AAA...: File name too long", no flag named)
    ("profiles-name-too-long", ["--profiles", "/tmp/" + "A" * 300],
     ["--profiles", "no such folder"]),
    ("profiles-empty", ["--profiles", ""], ["--profiles ''", "give a folder"]),  # was '.'
    ("block-size-7", ["--block-size", "7"], ["block_size 7", "allowed"]),
    ("budget-below-max-seqs", ["--max-num-batched-tokens", "8"],
     ["max_num_batched_tokens (8)", "max_num_seqs (1024)"]),   # H100: vllm serve's default
    ("result-dir-is-a-file", lambda d: ["--save-result", "--result-dir", str(d / "a_file")],
     ["--result-dir/--result-filename", "cannot write there"]),
    ("result-file-is-a-folder", lambda d: ["--save-result", "--result-dir", str(d.parent),
                                           "--result-filename", d.name],
     ["--result-dir/--result-filename", "is a folder"]),
    ("metric-percentiles-nan", ["--metric-percentiles", "nan"], ["--metric-percentiles"]),
    ("percentile-metrics-unknown", ["--percentile-metrics", "foo"], ["foo", "ttft, tpot"]),
    ("num-prompts-past-memory", ["--num-prompts", str(2**40)], ["out of memory"]),
    # (a ValueError traceback from numpy: "Maximum allowed dimension exceeded")
    ("num-prompts-past-an-array", ["--num-prompts", str(2**64)],
     ["--num-prompts 18446744073709551616", "out of memory"]),
    # parallelism past what one node of the hardware holds (-dp 100000 built 100,000
    # instances for minutes, -pp past the layers simulated stages without a layer)
    ("dp-past-the-node", ["-dp", "100000"],
     ["--data-parallel-size 100000", "100000 devices", "H100-SXM node holds 8",
      "dp x tp x pp <= 8"]),
    ("dp-tp-pp-past-the-node", ["-dp", "2", "-tp", "4", "-pp", "2"],
     ["16 devices", "holds 8"]),
    ("tp-huge", ["-tp", "100000"],
     ["--tensor-parallel-size=100000", "num_attention_heads=32", "1, 2, 4, 8, 16, 32"]),
    ("pp-huge", ["-pp", "100000"], ["--pipeline-parallel-size=100000", "allowed: 1..32"]),
    ("pp-past-the-layers", ["-pp", "33"], ["--pipeline-parallel-size=33", "num_hidden_layers=32"]),
]


@pytest.mark.parametrize("extra,needles", [c[1:] for c in BENCH_CASES],
                         ids=[c[0] for c in BENCH_CASES])
def test_bench_refuses_before_simulating(d, extra, needles, capsys, monkeypatch):
    monkeypatch.setattr(sim, "simulate", _no_simulation)
    rc = main([*_BENCH, *(extra(d) if callable(extra) else extra)])
    assert_one_line(capsys, rc, "llmsim", needles)


def test_bench_parallelism_refused_in_a_blink(capsys):
    """The bound is checked before any instance is built: -dp 100000 took minutes."""
    import time

    t0 = time.perf_counter()
    rc = main([*_BENCH, "-dp", "100000", "-tp", "100000", "-pp", "100000"])
    assert time.perf_counter() - t0 < 5
    assert_one_line(capsys, rc, "llmsim", ["--tensor-parallel-size=100000"])


@pytest.mark.parametrize("per_node,needles", [
    (None, ["holds 8", "the default; the hardware spec gives no devices_per_node"]),
    (4, ["holds 4", "the catalogue's devices_per_node"]),
])
def test_bench_devices_per_node_of_the_spec(per_node, needles):
    """A hardware spec without devices_per_node gets 8 and the message says so; with it,
    its value."""
    import argparse
    from dataclasses import replace

    from sim.bench import _check_parallel_sizes
    from sim.hardware import load_hardware

    hw = replace(load_hardware("H100-SXM"), devices_per_node=per_node)
    args = argparse.Namespace(model="meta-llama/Llama-3.1-8B")
    _check_parallel_sizes(hw, args, 2, 2, per_node // 4 if per_node else 2)  # fits
    with pytest.raises(sim.InputError) as exc:
        _check_parallel_sizes(hw, args, 1, 1, 9)
    for n in ["= 9 devices", *needles]:
        assert n in str(exc.value)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8", 1 << 21])
def test_hardware_devices_per_node_refused(bad):
    from sim.hardware import _from_mapping

    spec = {"name": "G", "peak_tflops": {"bf16": 100.0}, "mem_size_GiB": 80,
            "mem_bw_GBps": 2000, "link_bw_GBps": 100, "link_latency_ns": 500,
            "power_idle_W": 50, "power_tdp_W": 500, "devices_per_node": bad}
    with pytest.raises(sim.InputError, match="g.yaml: field 'devices_per_node' must be an "
                       "integer in 1..1048576"):
        _from_mapping(spec, "g.yaml")


def test_run_refuses_more_pipeline_stages_than_layers(d, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sim, "simulate", _no_simulation)
    c = cluster_dict(300, hardware="H100-SXM", pp_size=33)
    c["nodes"][0]["instances"][0]["num_npus"] = 33
    (tmp_path / "c.json").write_text(json.dumps(c))
    rc = main(["run", "--cluster", str(tmp_path / "c.json"), "--dataset", str(d / "w.jsonl"),
               "--output", str(tmp_path / "o.csv")])
    assert_one_line(capsys, rc, "llmsim", ["c.json", "pp_size=33", "num_hidden_layers=32"])


@pytest.mark.parametrize("edit,needles", [
    # 10**6 GiB of HBM: 4.6 * 10**8 KV blocks, a minute and 14 GB before the first step
    (lambda c: c["nodes"][0]["instances"][0]["npu_mem"].update(mem_size=10**6),
     ["instance 0", "npu_mem.mem_size=1e+06 GiB", "at most 33,554,432"]),
    (lambda c: c["nodes"][0]["instances"][0].update(num_gpu_blocks_override=2**30),
     ["instance 0", "1,073,741,824 blocks", "num_gpu_blocks_override"]),
    # 20,000 instances on one node: out of time and memory
    (lambda c: c["nodes"][0].update(num_instances=2000,
                                    instances=c["nodes"][0]["instances"] * 2000),
     ["instance 1181", "at most 33,554,432 in all", "fewer instances"]),
], ids=["mem-size-a-million-gib", "block-override-2-30", "2000-instances"])
def test_run_refuses_kv_caches_past_what_it_can_hold(d, tmp_path, edit, needles, capsys,
                                                       monkeypatch):
    import time

    monkeypatch.setattr(sim, "simulate", _no_simulation)
    c = cluster_dict(300, hardware="H100-SXM")
    c["nodes"][0]["instances"][0].pop("num_gpu_blocks_override")
    c["nodes"][0]["instances"][0]["npu_mem"].update(mem_size=80, mem_util=0.9)
    edit(c)
    (tmp_path / "c.json").write_text(json.dumps(c))
    t0 = time.perf_counter()
    rc = main(["run", "--cluster", str(tmp_path / "c.json"), "--dataset", str(d / "w.jsonl"),
               "--output", str(tmp_path / "o.csv")])
    assert_one_line(capsys, rc, "llmsim", ["c.json", *needles])
    assert time.perf_counter() - t0 < 20


# ------------------------------------------------------------------- workload JSONL
JSONL_CASES = [
    ("duplicate-key", '{"input_toks": 20, "input_toks": 30, "output_toks": 3}\n',
     [":1", "'input_toks' appears twice"]),
    ("duplicate-key-in-a-turn", '{"sub_requests": [{"input_toks": 2, "output_toks": 1, '
     '"output_toks": 5}]}\n', [":1", "'output_toks' appears twice"]),
    ("huge-int", '{"input_toks": ' + "9" * 5000 + ', "output_toks": 3}\n',
     [":1", "malformed JSON", "4300"]),
    # lengths past vLLM's int32 max_model_len: a 10**12-token prompt ran out of memory
    # (or for minutes) before the simulator said it could never fit
    ("enormous-prompt", '{"input_toks": 1000000000000, "output_toks": 3}\n',
     [":1", "'input_toks' must be in 1..2147483647", "int32"]),
    ("enormous-output", '{"input_toks": 3, "output_toks": 1000000000000}\n',
     [":1", "'output_toks' must be in 1..2147483647"]),
    # an arrival at 2**62 ns hung for hours building one time-series row per second
    ("arrival-146-years-out", '{"input_toks": 3, "output_toks": 3, "arrival_time_ns": '
     f'{2**62}}}\n', ["request 0 starts 4.612e+09 s", "4,611,686,019 rows of 1 s",
                       "at most 10,000,000", "--timeseries-interval-s 462"]),
    ("tool-pauses-146-years", '{"sub_requests": [{"input_toks": 2, "output_toks": 1}, '
     f'{{"input_toks": 2, "output_toks": 1, "tool_duration_ns": {2**62}}}]}}\n',
     ["request 0 starts", "tool pauses", "at most 10,000,000"]),
    # vLLM refuses a prompt with an id past the vocabulary; it was replayed silently
    ("token-id-past-the-vocabulary", '{"input_toks": 2, "output_toks": 1, '
     '"input_tok_ids": [5, 1000000000]}\n',
     ["request 0: input_tok_ids holds token id 1000000000", "out of the vocabulary of",
      "allowed: 0.."]),
]


@pytest.mark.parametrize("iv", ["1e-9", "1e-4", "1e300", "inf"])
def test_run_timeseries_interval_out_of_range(d, tmp_path, iv, capsys, monkeypatch):
    """1e-9 s ran for hours (a row per nanosecond of simulated time); 1e300 was an
    OverflowError traceback."""
    monkeypatch.setattr(sim, "simulate", _no_simulation)
    rc = main(["run", "--cluster", str(d / "c.json"), "--dataset", str(d / "w.jsonl"),
               "--output", str(tmp_path / "o.csv"), "--timeseries-interval-s", iv])
    assert_one_line(capsys, rc, "llmsim", ["--timeseries-interval-s", "0.001..1e9"])


def test_jsonl_with_a_byte_order_mark_runs_as_without(d, tmp_path, capsys):
    """A UTF-8 BOM (Windows editors write one) was a 'malformed JSON' error on line 1."""
    line = '{"input_toks": 20, "output_toks": 3, "arrival_time_ns": 0}\r\n'
    outs = []
    for name, data in (("plain", line.encode()), ("bom", b"\xef\xbb\xbf" + line.encode())):
        (tmp_path / f"{name}.jsonl").write_bytes(data)
        rc = main(["run", "--cluster", str(d / "c.json"), "--dataset",
                   str(tmp_path / f"{name}.jsonl"), "--output", str(tmp_path / f"{name}.csv"),
                   "--profiles", str(d / "profiles"), "--latency-provider", "measured"])
        assert rc == 0, capsys.readouterr().err
        outs.append((tmp_path / f"{name}.csv").read_bytes())
    assert outs[0] == outs[1]


@pytest.mark.parametrize("text,needles", [c[1:] for c in JSONL_CASES],
                         ids=[c[0] for c in JSONL_CASES])
def test_jsonl_refused(d, text, needles, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sim, "simulate", _no_simulation)
    (tmp_path / "w.jsonl").write_text(text)
    rc = main(["run", "--cluster", str(d / "c.json"), "--dataset", str(tmp_path / "w.jsonl"),
               "--output", str(tmp_path / "o.csv")])
    assert_one_line(capsys, rc, "llmsim", ["w.jsonl", *needles])


# Valid lines in the shapes the project replays: a ShareGPT request with token ids, an
# agentic session with tool calls, a flat request with a priority.
_VALID_LINES = [
    json.dumps({"input_toks": 4, "output_toks": 3, "arrival_time_ns": 1000,
                "input_tok_ids": [1, 2, 3, 4], "output_tok_ids": [5, 6, 7]}),
    json.dumps({"session_id": "s1", "arrival_time_ns": 5000, "sub_requests": [
        {"input_toks": 8, "output_toks": 2, "tool_duration_ns": 100},
        {"input_toks": 12, "output_toks": 4, "input_tok_ids": list(range(12))}]}),
    json.dumps({"input_toks": 30, "output_toks": 5, "arrival_time_ns": 9000, "priority": 1}),
]


@st.composite
def mangled_jsonl(draw):
    """The valid lines, some mangled: a field dropped or given another type (in the
    parsed object), or the text truncated or with garbage bytes inserted."""
    lines = []
    for line in draw(st.lists(st.sampled_from(_VALID_LINES), min_size=1, max_size=4)):
        how = draw(st.sampled_from(["keep", "drop", "retype", "truncate", "garbage"]))
        if how in ("drop", "retype"):
            obj = json.loads(line)
            target = obj["sub_requests"][draw(st.integers(0, 1))] \
                if "sub_requests" in obj and draw(st.booleans()) else obj
            key = draw(st.sampled_from(sorted(target)))
            if how == "drop":
                del target[key]
            else:
                target[key] = draw(st.none() | st.booleans() | st.text(max_size=4)
                                   | st.floats() | st.integers(-2**70, 2**70)
                                   | st.lists(st.integers(-3, 3), max_size=3))
            lines.append(json.dumps(obj).encode())
        elif how == "truncate":
            lines.append(line.encode()[:draw(st.integers(0, len(line) - 1))])
        elif how == "garbage":
            at = draw(st.integers(0, len(line)))
            lines.append(line.encode()[:at] + draw(st.binary(min_size=1, max_size=6))
                         + line.encode()[at:])
        else:
            lines.append(line.encode())
    return b"\n".join(lines) + b"\n"


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=mangled_jsonl())
def test_fuzz_mangled_jsonl_exit_2_or_success(d, tmp_path, data, capsys):
    p = tmp_path / "fuzz.jsonl"
    p.write_bytes(data)
    try:
        workload = sim.load_jsonl(p)
    except sim.InputError as exc:
        assert "\n" not in str(exc) and str(p) in str(exc)
        return
    assert workload.num_requests >= 1


@st.composite
def mangled_hf_configs(draw):
    cfg = copy.deepcopy(HF)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(cfg) + ["num_experts", "quantization_config"]))
        if draw(st.booleans()) and key in cfg:
            del cfg[key]
        else:
            cfg[key] = draw(st.none() | st.booleans() | st.text(max_size=5) | st.floats()
                            | st.integers(-2**70, 2**70)
                            | st.dictionaries(st.sampled_from(["quant_method", "config_groups",
                                                               "quantization", "weights"]),
                                              st.text(max_size=4) | st.integers(), max_size=3)
                            | st.lists(st.integers(), max_size=2))
    text = json.dumps(cfg).encode()
    if draw(st.booleans()):
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.binary(max_size=4)) + text[at + draw(st.integers(0, 3)):]
    return text


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=mangled_hf_configs())
def test_fuzz_mangled_model_config_exit_2_or_success(tmp_path, data):
    from sim.model import from_hf_config

    p = tmp_path / "config.json"
    p.write_bytes(data)
    try:
        spec = from_hf_config(p)
    except sim.InputError as exc:
        assert "\n" not in str(exc) and str(p) in str(exc)
        return
    # what was accepted is usable: every size the formulas divide by is positive
    assert spec.num_attention_heads % spec.num_key_value_heads == 0
    assert spec.kv_bytes_per_token(1) > 0 and spec.weight_bytes(1) > 0


@st.composite
def mangled_csv(draw):
    text = "layer,tokens,time_us\n" + "".join(
        f"{layer},{t},{1 + t / 1000}\n" for layer in ("qkv_proj", "o_proj") for t in (1, 16, 64))
    lines = text.splitlines()
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        cells = lines[i].split(",")
        j = draw(st.integers(0, len(cells) - 1))
        cells[j] = draw(st.sampled_from(["", "nan", "-1", "inf", "1e400", "x", "1.5", "\x00",
                                         "0", "3", '"']))
        lines[i] = ",".join(cells)
    return ("\n".join(lines) + "\n").encode()


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=mangled_csv())
def test_fuzz_profile_csv_is_checked_or_refused(tmp_path, data):
    import math

    from sim.latency.measured import _read_csv

    p = tmp_path / "dense.csv"
    p.write_bytes(data)
    try:
        rows = _read_csv(p, ("layer", "tokens", "time_us"))
    except sim.InputError as exc:
        assert "\n" not in str(exc) and str(p) in str(exc)
        return
    for r in rows:  # whatever is accepted is a usable grid point
        assert math.isfinite(float(r["time_us"])) and float(r["time_us"]) >= 0
        assert float(r["tokens"]).is_integer() and float(r["tokens"]) >= 0


# ------------------------------------------------------------ experiments/validate_vllm
def _validation_case(tmp_path, name, mutate):
    src = SHARED / "validation" / "RTX4090-Llama-3.1-8B"
    if not src.is_dir():
        pytest.skip("needs ../shared/data/validation")
    dst = tmp_path / name
    shutil.copytree(src, dst)
    mutate(dst)
    return dst


VALIDATE_CASES = [
    ("no-such-folder", lambda f: shutil.rmtree(f), ["no such folder"]),
    ("meta-missing", lambda f: (f / "vllm" / "meta.json").unlink(), ["missing vllm/meta.json"]),
    ("no-cluster-file", lambda f: (f / "cluster.json").unlink(),
     ["missing cluster.json", "cluster.json (or config.json)"]),
    ("meta-malformed", lambda f: (f / "vllm" / "meta.json").write_text("{bad"),
     ["meta.json", "malformed JSON"]),
    ("meta-a-list", lambda f: (f / "vllm" / "meta.json").write_text("[1]"),
     ["meta.json", "engine_kwargs.max_num_seqs"]),
    ("requests-line-broken", lambda f: (f / "vllm" / "requests.jsonl").open("a").write("{x\n"),
     ["requests.jsonl:", "malformed JSON"]),
]


@pytest.mark.parametrize("mutate,needles", [c[1:] for c in VALIDATE_CASES],
                         ids=[c[0] for c in VALIDATE_CASES])
def test_validate_vllm_refuses(tmp_path, mutate, needles, capsys, monkeypatch):
    from experiments.validate_vllm import main as validate_main

    monkeypatch.setattr(sim, "simulate", _no_simulation)
    folder = _validation_case(tmp_path, "case", mutate)
    assert_one_line(capsys, validate_main([str(folder)]), "validate_vllm", needles)


def test_validate_vllm_reads_llmservingsims_config_json(tmp_path, monkeypatch):
    """LLMServingSim's bench/examples folders name the cluster file config.json and give
    npu_mem.mem_util alone: validate_vllm replays such a folder as it replays the same
    case with cluster.json (it refused it: 'missing cluster.json')."""
    from experiments import validate_vllm

    seen = []
    monkeypatch.setattr(sim, "simulate", lambda cluster, wl, opts: seen.append(
        (cluster.instances[0].npu_mem, opts)) or "result")

    def to_config_json(f):
        raw = json.loads((f / "cluster.json").read_text())
        for ins in raw["nodes"][0]["instances"]:
            ins["npu_mem"] = {"mem_util": ins["npu_mem"]["mem_util"]}
        (f / "config.json").write_text(json.dumps(raw))
        (f / "cluster.json").unlink()

    for name, mutate in (("as_shared", lambda f: None), ("as_bench_examples", to_config_json)):
        folder = _validation_case(tmp_path, name, mutate)
        validate_vllm.check_folder(folder)
        assert validate_vllm.run_validation(folder)[0] == "result"
    (mem_a, opts_a), (mem_b, opts_b) = seen
    assert opts_a == opts_b
    assert (mem_a.mem_size_gib, mem_a.mem_util) == (mem_b.mem_size_gib, mem_b.mem_util)


def test_validate_vllm_takes_limits_left_to_vllm_from_its_resolved_config(tmp_path):
    """A run that left max_num_seqs / max_num_batched_tokens to vLLM (null in engine_kwargs)
    is replayed with the values vLLM resolved (its meta.json's resolved_config); it was
    refused."""
    from experiments.validate_vllm import load_meta

    def left_to_vllm(f):
        meta = json.loads((f / "vllm" / "meta.json").read_text())
        meta["engine_kwargs"].update(max_num_seqs=None, max_num_batched_tokens=None)
        (f / "vllm" / "meta.json").write_text(json.dumps(meta))

    folder = _validation_case(tmp_path, "case", left_to_vllm)
    kw = load_meta(folder)["engine_kwargs"]
    assert (kw["max_num_seqs"], kw["max_num_batched_tokens"]) == (256, 2048)


def test_validate_vllm_unknown_provider(capsys):
    from experiments.validate_vllm import main as validate_main

    rc = validate_main(["/nonexistent", "--latency-provider", "nope"])
    assert_one_line(capsys, rc, "validate_vllm", ["--latency-provider", "'nope'", "roofline"])


# ------------------------------------------------------------------ as subprocesses
def test_subprocess_llmsim_compare_and_model_config(tmp_path):
    """The real processes: exit 2, one line, no traceback (nothing left to an in-process
    handler the console script does not have)."""
    (tmp_path / "bad.json").write_bytes(b"\xff\xfe")
    (tmp_path / "good.json").write_text(_GOOD_RESULT)
    env_path = f"{REPO}:{REPO / 'astra-sim'}"
    runs = [[sys.executable, "-m", "sim", "compare", str(tmp_path / "good.json"),
             str(tmp_path / "bad.json")],
            [sys.executable, str(REPO / "experiments" / "validate_vllm.py"),
             str(tmp_path / "nope")]]
    for cmd in runs:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False,
                           env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"}, cwd=REPO)
        assert p.returncode == 2, (cmd, p.stderr)
        assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


# --------------------------------------------------- cluster files


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_cluster_key_given_twice_is_refused(d, tmp_path, suffix, capsys, monkeypatch):
    monkeypatch.setattr(sim, "simulate", _no_simulation)
    c = cluster_dict(300, hardware="H100-SXM")
    c["nodes"][0]["instances"][0]["max_num_seqs"] = 8
    text = json.dumps(c) if suffix == ".json" else yaml.safe_dump(c, sort_keys=False)
    text = text.replace('"max_num_seqs": 8', '"max_num_seqs": 8, "max_num_seqs": 64') \
        .replace("max_num_seqs: 8\n", "max_num_seqs: 8\n    max_num_seqs: 64\n")
    (tmp_path / f"c{suffix}").write_text(text)
    rc = main(["run", "--cluster", str(tmp_path / f"c{suffix}"), "--dataset",
               str(d / "w.jsonl"), "--output", str(tmp_path / "o.csv")])
    assert_one_line(capsys, rc, "llmsim", ["'max_num_seqs' appears twice"])


def test_load_cluster_path_with_a_nul_byte_is_an_input_error(tmp_path):
    """sim.load_cluster (the README's library entry) raised ValueError('embedded null
    byte') where sim.load_jsonl gave an InputError."""
    with pytest.raises(sim.InputError, match="cannot read cluster config: embedded null byte"):
        sim.load_cluster(str(tmp_path / "c\x00.json"))


def test_cluster_yaml_syntax_error_names_the_line(d, tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("num_nodes: 1\nnodes:\n\t- x\n")
    rc = main(["run", "--cluster", str(tmp_path / "c.yaml"), "--dataset", str(d / "w.jsonl"),
               "--output", str(tmp_path / "o.csv")])
    assert_one_line(capsys, rc, "llmsim", ["c.yaml", "line 3"])
