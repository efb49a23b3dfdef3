"""Tests of the training harness: data, schedule, training, sharding, resume, divergence, CLI."""

import dataclasses
import json
import math
import os
import re
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from flax import nnx

from experiments.harness import data as data_lib
from experiments.harness import distributed
from experiments.harness import probes, sharding, train_cli
from experiments.harness import train as train_lib
from experiments.harness import train_config
from experiments.harness.train_config import TrainConfig
from jaxnorm.models import TransformerConfig

# The repository: tests/experiments/ is two below.
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_MODEL = TransformerConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, max_len=32)
STEPS = 8
# Most runs below share the compiled step of the reference config (train() caches compiled
# steps per config, ignoring host-side fields): compilation dominates the test time.
REF_CLI = ["--steps", str(STEPS), "--d-model", "32", "--layers", "2", "--heads", "2", "--d-ff",
           "64", "--seq-len", "32", "--batch-size", "16", "--lr", "5e-3", "--eval-batches", "1"]
TEXT = "".join(f"def f{i % 7}(x):\n    return x * {i % 5} + {i % 3}  # the quick brown fox\n"
               for i in range(400))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  path = tmp_path_factory.mktemp("data") / "tiny.txt"
  path.write_text(TEXT)
  return data_lib.load_corpus(str(path))


def _config(**kw):
  base = dict(model=TINY_MODEL, steps=STEPS, batch_size=16, seq_len=32, lr=5e-3, eval_every=4,
              eval_batches=1, checkpoint_every=3)
  return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def reference_run(corpus, tmp_path_factory):
  """One uninterrupted single-device run, shared by the sharding and resume tests."""
  out = tmp_path_factory.mktemp("ref")
  return train_lib.train(_config(), out, progress=False, corpus=corpus), out


def _losses(summary):
  return np.array([loss for _, loss in summary["train_curve"]])


# ----------------------------------------------------------------------------------------------
# Data.


def test_default_corpus_is_deterministic():
  a, b = data_lib.load_corpus(), data_lib.load_corpus()
  assert a.sha256 == b.sha256 and a.n_bytes == b.n_bytes == a.train.size + a.valid.size
  assert a.files == sorted(a.files) and len(a.files) > 20
  assert all(f.split("/")[0] in data_lib.DEFAULT_PACKAGES for f in a.files)
  assert not any("/test/" in f for f in a.files)
  assert a.train.dtype == np.uint8 and a.valid.size > 0.05 * a.n_bytes
  assert 2.0 < data_lib.unigram_entropy_nats(a) < math.log(256)


def test_data_file_and_errors(tmp_path, corpus):
  assert corpus.n_bytes == len(TEXT) and corpus.files == ["tiny.txt"]
  assert bytes(corpus.train) + bytes(corpus.valid) == TEXT.encode()
  with pytest.raises(FileNotFoundError, match="does not exist"):
    data_lib.load_corpus(str(tmp_path / "missing.txt"))
  bad = tmp_path / "bad.txt"
  bad.write_bytes(b"\xff\xfe" * 100)
  with pytest.raises(ValueError, match="not valid UTF-8"):
    data_lib.load_corpus(str(bad))


def test_batches_reproducible_and_shifted(corpus):
  stream = data_lib.batches(corpus.train, batch_size=4, seq_len=16, seed=3)
  first = [next(stream) for _ in range(3)]
  again = data_lib.batches(corpus.train, batch_size=4, seq_len=16, seed=3, start=2)
  np.testing.assert_array_equal(next(again)[0], first[2][0])  # resumable at any index
  x, y = first[0]
  assert x.shape == y.shape == (4, 16) and x.dtype == np.int32
  np.testing.assert_array_equal(x[:, 1:], y[:, :-1])
  other = next(data_lib.batches(corpus.train, batch_size=4, seq_len=16, seed=4))
  assert not np.array_equal(other[0], x)
  with pytest.raises(ValueError, match="batch_size must be a positive int"):
    next(data_lib.batches(corpus.train, batch_size=0, seq_len=16, seed=0))


def test_unigram_entropy():
  c = data_lib.Corpus(train=np.array([0, 1, 2, 3] * 10, np.uint8), valid=np.zeros(4, np.uint8),
                      name="x", sha256="", n_bytes=44, files=[])
  assert data_lib.unigram_entropy_nats(c) == pytest.approx(math.log(4))


# ----------------------------------------------------------------------------------------------
# Configuration and schedule.


@pytest.mark.parametrize("kw, err, match", [
    (dict(steps=-1), ValueError, "steps must be >= 0, got -1"),
    (dict(lr=0.0), ValueError, "lr must be > 0"),
    (dict(schedule="linear"), ValueError, "schedule must be one of"),
    (dict(b2=1.0), ValueError, "b2 must be >= 0.0 and < 1.0"),
    (dict(seq_len=64), ValueError, "exceeds the model's max_len=32"),
    (dict(clip_norm=-1.0), ValueError, "clip_norm"),
    (dict(batch_size=2.5), TypeError, "batch_size must be a Python int"),
    (dict(lr="1e-3"), TypeError, "lr must be a Python number"),
    (dict(model={}), TypeError, "model must be a TransformerConfig"),
    (dict(decay_timescale=0), ValueError, "decay_timescale must be >= 1"),
    (dict(log_attention=1), TypeError, "log_attention must be a bool"),
    (dict(z_loss=-1e-4), ValueError, "z_loss must be >= 0.0"),
    (dict(alt_eval_steps=(0,)), ValueError, r"alt_eval_steps\[i\] must be >= 1"),
    (dict(alt_eval_steps=(99,)), ValueError, "alt_eval_steps must lie in 1..steps=8, got 99"),
    (dict(alt_eval_steps=4), TypeError, "alt_eval_steps must be a tuple of steps"),
])
def test_train_config_rejects(kw, err, match):
  with pytest.raises(err, match=match):
    _config(**kw)


def test_weight_decay_skips_norm_scales_and_biases_even_when_stacked():
  """Issue 32: scanned blocks stack a norm scale into (n_layers, d); rank alone would decay it."""
  _, params, _ = train_lib.init_params(_config().model, 0)
  mask = train_config.decay_mask(params)
  flat = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(mask)}
  assert flat["['blocks']['attn_norm']['scale']"] is False and flat["['blocks']['mlp']['fc_in']['bias']"] is False
  assert flat["['blocks']['mlp']['fc_in']['kernel']"] is True and flat["['embed']['embedding']"] is True
  assert np.shape(params["blocks"]["attn_norm"]["scale"])[0] == 2          # stacked: rank 2


def test_z_loss_adds_the_squared_log_partition_and_logs_the_cross_entropy(corpus):
  cfg = _config()
  graphdef, params, _ = train_lib.init_params(cfg.model, 0)
  x, y = data_lib.batch_at(corpus.train, 0, batch_size=cfg.batch_size, seq_len=cfg.seq_len, seed=0)
  ce, _ = train_lib.loss_and_stats(graphdef, params, x, y)
  total, stats = train_lib.loss_and_stats(graphdef, params, x, y, z_loss=1e-2)
  logits = nnx.merge(graphdef, params)(x)
  log_z = jax.nn.logsumexp(logits, axis=-1)
  assert float(stats["ce"]) == pytest.approx(float(ce), rel=1e-6)
  assert float(total) == pytest.approx(float(ce) + 1e-2 * float(np.mean(np.square(log_z))), rel=1e-5)


def test_train_config_roundtrip():
  cfg = _config(clip_norm=1.0, data="x.txt")
  assert TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_schedules():
  def lrs(**kw):
    sched = train_config.learning_rate_schedule(_config(lr=1.0, steps=20, **kw))
    return np.array([float(sched(c)) for c in range(20)])

  warm = lrs(warmup=4, schedule="inverse_sqrt")
  np.testing.assert_allclose(warm[:4], [0.25, 0.5, 0.75, 1.0])
  np.testing.assert_allclose(warm[4], 1.0)  # the first update after warm-up is at the peak
  np.testing.assert_allclose(warm[4 + 12], math.sqrt(2 / 14), rtol=1e-6)  # tau = steps // 10
  # The timescale does not depend on the warm-up: an explicit tau is kept as given.
  explicit = lrs(warmup=4, schedule="inverse_sqrt", decay_timescale=4)
  np.testing.assert_allclose(explicit[4 + 12], math.sqrt(4 / 16), rtol=1e-6)
  assert train_config.describe_schedule(_config(lr=1.0, steps=20, warmup=4)) == (
      "inverse_sqrt, peak 1, warm-up 4, tau 2, 20 steps")
  with pytest.raises(TypeError, match="config must be a TrainConfig"):
    train_config.describe_schedule({})
  none = lrs(warmup=0, schedule="inverse_sqrt")
  assert none[0] == 1.0 and np.all(np.diff(none) < 0)
  np.testing.assert_allclose(none[8], math.sqrt(2 / 10), rtol=1e-6)  # tau = steps // 10
  cos = lrs(warmup=0, schedule="cosine")
  assert cos[0] == pytest.approx(1.0) and cos[-1] == pytest.approx(0.1, abs=0.01)
  assert np.all(np.diff(cos) <= 0)
  np.testing.assert_allclose(lrs(warmup=5, schedule="constant")[5:], 1.0)


# ----------------------------------------------------------------------------------------------
# Training.


def _assert_learns(summary, steps=STEPS):
  losses = _losses(summary)
  assert not summary["diverged"] and summary["steps_done"] == steps and len(losses) == steps
  assert losses[-3:].mean() < losses[:2].mean() - 0.3, losses
  vals = [v for _, v in summary["val_curve"]]
  assert vals[-1] < vals[0] and summary["final_val_loss"] == vals[-1]


# Every position trains; the two norm types alternate (each position x type pair is checked
# against autodiff in test_models.py, and the reference run is pre + layer_norm).
@pytest.mark.parametrize("position, norm_type", [
    ("pre", "rms_norm"), ("post", "layer_norm"), ("sandwich", "rms_norm"), ("deepnorm", "layer_norm")])
def test_each_layout_trains(position, norm_type, corpus, tmp_path):
  model = dataclasses.replace(TINY_MODEL, norm_position=position, norm_type=norm_type)
  summary = train_lib.train(_config(model=model, checkpoint_every=0), tmp_path, progress=False,
                            corpus=corpus)
  _assert_learns(summary)


def test_metrics_and_config_files(reference_run):
  summary, out = reference_run
  _assert_learns(summary)
  record = json.loads((out / "config.json").read_text())
  assert record["train"] == _config().to_dict() and record["init"] == "xavier"
  lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
  steps = [l for l in lines if "loss" in l]
  assert [l["step"] for l in steps] == list(range(1, STEPS + 1))
  for l in steps:
    for group in ("attn_qkv", "attn_out", "mlp_in", "mlp_out"):
      assert len(l[group]) == 2 and all(g > 0 for g in l[group])
    assert l["grad_norm"] > 0 and 0 < l["update_ratio"] < 1 and l["lr"] > 0
    # The global norm bounds each per-layer norm.
    assert max(max(l[g]) for g in ("attn_qkv", "attn_out", "mlp_in", "mlp_out")) < l["grad_norm"]
  assert [l["step"] for l in lines if "val_loss" in l] == [0, 4, 8]
  alt = [l for l in lines if "val_loss_alt" in l]
  lines = [l for l in lines if "val_loss_alt" not in l]
  # the final model on a second set of validation windows, once: the evaluation noise
  assert [l["step"] for l in alt] == [8] and summary["final_val_loss_alt"] == alt[0]["val_loss_alt"]
  assert math.isfinite(summary["final_val_loss_alt"]) and summary["final_val_loss_alt"] != summary["final_val_loss"]
  for l in lines:  # per layer, in the train lines and the evaluation lines
    pre = "" if "loss" in l else "val_"
    assert len(l[pre + "attn_max_logit"]) == 2 and len(l[pre + "attn_entropy"]) == 2
    # Causal rows of 32 keys at most: 0 < entropy <= mean_t log(t + 1) < log 32.
    assert all(0 < e < math.log(32) for e in l[pre + "attn_entropy"])
  assert summary["tokens_per_s"] > 0 and summary["final_val_loss"] == lines[-1]["val_loss"]
  assert summary["corpus"]["n_bytes"] == len(TEXT)


def test_alt_eval_steps_score_the_same_model_on_the_second_windows(reference_run, corpus, tmp_path):
  """``alt_eval_steps``: the second windows at the chosen steps too (a ladder's noise), the training unchanged."""
  ref, _ = reference_run
  summary = train_lib.train(_config(alt_eval_steps=(4,)), tmp_path, progress=False, corpus=corpus)
  assert [s for s, _ in summary["val_curve_alt"]] == [4, 8]
  assert summary["val_curve"] == ref["val_curve"] and summary["train_curve"] == ref["train_curve"]
  assert summary["final_val_loss_alt"] == ref["final_val_loss_alt"] == summary["val_curve_alt"][-1][1]


def test_kill_and_resume_reproduces_the_curve(reference_run, corpus, tmp_path):
  """Stop after 5 steps (checkpoint at 3, metrics up to 5), then resume: same curve."""
  ref, _ = reference_run
  partial = train_lib.train(_config(), tmp_path, progress=False, corpus=corpus, stop_after=5)
  assert partial["steps_done"] == 5 and partial["final_val_loss"] is None
  assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.isdigit()) == ["3"]
  resumed = train_lib.train(_config(), tmp_path, progress=False, corpus=corpus)
  np.testing.assert_allclose(_losses(resumed), _losses(ref), rtol=1e-6)
  assert [s for s, _ in resumed["train_curve"]] == list(range(1, STEPS + 1))  # no duplicates
  np.testing.assert_allclose([v for _, v in resumed["val_curve"]],
                             [v for _, v in ref["val_curve"]], rtol=1e-6)
  assert resumed["final_val_loss"] == pytest.approx(ref["final_val_loss"], rel=1e-6)
  with pytest.raises(ValueError, match="different config"):
    train_lib.train(_config(lr=1e-3), tmp_path, progress=False, corpus=corpus)


@pytest.mark.parametrize("fsdp", [False, True])
def test_sharded_matches_single_device(reference_run, corpus, tmp_path, fsdp):
  assert jax.device_count() == 8
  ref, _ = reference_run
  mesh = sharding.make_mesh()
  sharded = train_lib.train(_config(fsdp=fsdp), tmp_path, progress=False, corpus=corpus,
                            mesh=mesh)
  np.testing.assert_allclose(_losses(sharded), _losses(ref), rtol=2e-5, atol=2e-5)
  np.testing.assert_allclose([v for _, v in sharded["val_curve"]],
                             [v for _, v in ref["val_curve"]], rtol=2e-5)
  with pytest.raises(ValueError, match="batch_size=12 must be divisible"):
    train_lib.train(_config(batch_size=12), tmp_path / "x", progress=False, corpus=corpus,
                    mesh=mesh)


def test_divergence_is_recorded(corpus, tmp_path):
  # Same compiled step as the reference run: the learning rate is an injected hyper-parameter.
  cfg = _config(lr=50.0, steps=30, checkpoint_every=0, eval_every=0, divergence_loss=10.0)
  summary = train_lib.train(cfg, tmp_path, progress=False, corpus=corpus)
  assert summary["diverged"] and 1 <= summary["diverged_at"] < 30
  assert summary["final_val_loss"] is None and summary["steps_done"] == summary["diverged_at"]
  lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert lines[-1] == {"step": summary["diverged_at"], "event": "diverged",
                       "loss": lines[-2]["loss"]}
  last = lines[-2]["loss"]
  assert isinstance(last, str) or last > 10.0
  assert json.loads((tmp_path / "summary.json").read_text())["diverged"] is True


@pytest.mark.slow
def test_init_instrumentation(corpus):
  stats = probes.grad_norms_at_init(TINY_MODEL, corpus, batch_size=4, seq_len=16, seed=0,
                                       n_batches=2)
  for group in ("attn_qkv", "attn_out", "mlp_in", "mlp_out"):
    assert len(stats[group]) == 2 and all(g > 0 for g in stats[group])
  assert len(stats["residual_sq_norm"]) == 5 and stats["grad_norm"] > 0
  # The expected gradient is the norm of the batch mean: never above the mean of the norms.
  one = [probes.grad_norms_at_init(TINY_MODEL, corpus, batch_size=4, seq_len=16, seed=0,
                                   n_batches=n) for n in (1, 2)]
  assert stats == one[1]
  import jax
  from experiments.harness import data as data_lib
  from experiments.harness.train import init_params, layer_grad_norms, loss_and_stats
  graphdef, params, paths = init_params(TINY_MODEL, 0)
  per_batch = []
  grad = jax.jit(jax.grad(lambda p, x, y: loss_and_stats(graphdef, p, x, y)[0]))  # one compile
  for i in range(2):
    x, y = data_lib.batch_at(corpus.train, i, batch_size=4, seq_len=16, seed=0)
    per_batch.append(grad(params, x, y))
  mean = jax.tree.map(lambda a, b: (a + b) / 2, *per_batch)
  np.testing.assert_allclose(stats["mlp_out"], layer_grad_norms(mean, paths)["mlp_out"], rtol=1e-4)
  mean_of_norms = np.mean([layer_grad_norms(g, paths)["mlp_out"] for g in per_batch], axis=0)
  assert np.all(np.asarray(stats["mlp_out"]) <= mean_of_norms + 1e-6)
  # DeepNet's model update, on the hidden state (relative) and on the logits.
  sizes = probes.model_update_size(TINY_MODEL, _config(batch_size=8), corpus, steps=2)
  assert len(sizes) == 2 and all(0 < s < 2.5 for s in sizes)
  logit_sizes = probes.model_update_size(TINY_MODEL, _config(batch_size=8), corpus, steps=1,
                                         on="logits", relative=False)
  assert len(logit_sizes) == 1 and logit_sizes[0] > 0
  with pytest.raises(ValueError, match="on must be one of"):
    probes.model_update_size(TINY_MODEL, _config(), corpus, on="output")


def test_throughput(reference_run, corpus, monkeypatch):
  """The probe times ``steps`` chained train steps on the corpus' batches and counts tokens right.

  The train step is wrapped (the reference run's compiled step, no compilation here) to record
  each call: its batch, whether it was given the parameters the previous call returned, and how
  long it took. The probe's timed window holds the timed calls, so its ``step_ms`` is at least
  their mean duration measured here; its ``tokens_per_s`` is batch x length / step time.
  """
  steps, batch_size, seq_len = 3, 16, 32
  calls = []

  def counting(compiled):
    step = compiled[0]

    def wrapped(params, opt_state, inputs, targets):
      t0 = time.perf_counter()
      out = jax.block_until_ready(step(params, opt_state, inputs, targets))
      calls.append(dict(inputs=np.asarray(inputs), params_in=jax.tree.leaves(params)[0],
                        params_out=jax.tree.leaves(out[0])[0], loss=float(out[2]["loss"]),
                        seconds=time.perf_counter() - t0))
      return out
    return (wrapped, *compiled[1:])

  real = probes.compiled_steps
  monkeypatch.setattr(probes, "compiled_steps", lambda *a, **k: counting(real(*a, **k)))
  res = probes.throughput(TINY_MODEL, batch_size=batch_size, seq_len=seq_len, steps=steps,
                          corpus=corpus)
  assert res["norm_impl"] == "jaxnorm" and res["norm_type"] == TINY_MODEL.norm_type
  assert len(calls) == steps + 1  # one untimed (compiling) call, then the timed ones
  for i, call in enumerate(calls):
    x, _ = data_lib.batch_at(corpus.train, max(i - 1, 0), batch_size=batch_size,
                             seq_len=seq_len, seed=0)
    np.testing.assert_array_equal(call["inputs"], x)
    if i:  # each step trains on from the parameters the previous one returned
      assert call["params_in"] is calls[i - 1]["params_out"]
  assert calls[-1]["loss"] < calls[0]["loss"], [c["loss"] for c in calls]
  timed_ms = 1e3 * sum(c["seconds"] for c in calls[1:]) / steps
  assert res["step_ms"] >= timed_ms, (res["step_ms"], timed_ms)
  assert res["tokens_per_s"] == pytest.approx(batch_size * seq_len / (res["step_ms"] / 1e3),
                                              rel=1e-9)


def test_compare_norm_impl_alternates_and_keeps_the_best(monkeypatch):
  calls = []
  speeds = {"jaxnorm": iter([100.0, 300.0]), "flax": iter([200.0, 150.0])}

  def fake(model_config, **kwargs):
    calls.append(model_config.norm_impl)
    return {"tokens_per_s": next(speeds[model_config.norm_impl]), "compile_s": len(calls),
            "norm_impl": model_config.norm_impl}

  monkeypatch.setattr(probes, "throughput", fake)
  res = probes.compare_norm_impl(TINY_MODEL, repeats=2)
  assert calls == ["jaxnorm", "flax", "jaxnorm", "flax"]
  assert res["jaxnorm"]["tokens_per_s"] == 300.0 and res["flax"]["tokens_per_s"] == 200.0
  assert res["jaxnorm"]["compile_s"] == 1  # the compile time of the first (compiling) call
  assert res["ratio"] == pytest.approx(1.5)


def test_learning_rate_sweeps_share_one_compilation():
  a = train_lib.compiled_steps(_config(lr=1e-3, warmup=5, steps=100, seed=3))
  b = train_lib.compiled_steps(_config(lr=0.5, b2=0.95, weight_decay=0.1, eval_every=9))
  c = train_lib.compiled_steps(_config(schedule="cosine"))
  assert a is b and a is not c


# ----------------------------------------------------------------------------------------------
# Command line and multi-process.


@pytest.mark.parametrize("argv, match", [
    (["--steps", "-5"], "--steps: expected a non-negative integer (>= 0), got -5"),
    (["--norm-position", "middle"], "--norm-position: invalid choice: 'middle'"),
    (["--data", "/nonexistent/corpus.txt"], "--data: file '/nonexistent/corpus.txt' does not"),
    (["--lr", "0"], "--lr: expected a positive number (> 0), got 0"),
    (["--d-model", "30", "--heads", "4"], "n_heads=4 must divide d_model=30"),
    (["--seq-len", "0"], "--seq-len: expected a positive integer"),
    (["--qk-norm", "l2"], "--qk-norm: invalid choice: 'l2'"),
    (["--norm-scaling", "--norm-position", "post"], "norm_scaling=True scales the block's input norms"),
])
def test_cli_rejects_bad_values(argv, match, capsys):
  with pytest.raises(SystemExit) as exc:
    train_cli.main(argv)
  assert exc.value.code == 2
  assert match in capsys.readouterr().err


def test_cli_trains(reference_run, tmp_path, capsys):
  ref, _ = reference_run
  data = tmp_path / "tiny.txt"
  data.write_text(TEXT)
  out = tmp_path / "run"
  code = train_cli.main([*REF_CLI, "--data", str(data), "--devices", "1", "--out", str(out),
                         "--no-progress", "--eval-every", "0"])
  assert code == 0
  assert "final val loss" in capsys.readouterr().out
  record = json.loads((out / "config.json").read_text())
  assert record["train"]["model"] == json.loads(json.dumps(dataclasses.asdict(TINY_MODEL)))
  assert record["init"] == "xavier"
  lines = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
  assert len(lines) == STEPS + 3  # eval at 0, the steps, eval at the end, the end on a second set of windows
  np.testing.assert_allclose([l["loss"] for l in lines if "loss" in l], _losses(ref), rtol=1e-6)


def test_distributed_settings_are_checked(monkeypatch):
  for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
    monkeypatch.delenv(k, raising=False)
  assert distributed.initialize() is False
  with pytest.raises(ValueError, match="needs all of coordinator_address"):
    distributed.initialize("127.0.0.1:1234")
  with pytest.raises(ValueError, match=r"process_id must be in \[0, num_processes=2\)"):
    distributed.initialize("127.0.0.1:1234", 2, 5)


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_two_process_run_matches_single_process(reference_run, tmp_path):
  """jax.distributed with a local coordinator: 2 CPU processes x 1 device, data parallel."""
  ref, _ = reference_run
  data = tmp_path / "tiny.txt"
  data.write_text(TEXT)
  # One device a process; the conftest's other compile flags are kept (they halve the compiles).
  flags = re.sub(r"--xla_force_host_platform_device_count=\d+",
                 "--xla_force_host_platform_device_count=1", os.environ["XLA_FLAGS"])
  env = {**os.environ, "XLA_FLAGS": flags, "PYTHONPATH": REPO, "JAX_PLATFORMS": "cpu"}
  port = _free_port()
  procs = [subprocess.Popen(
      [sys.executable, "-m", "experiments", "train", *REF_CLI, "--eval-every", "0", "--data",
       str(data), "--no-progress", "--out", str(tmp_path / "mp"),
       "--coordinator-address", f"127.0.0.1:{port}", "--num-processes", "2",
       "--process-id", str(i)], cwd=REPO, env=env, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True) for i in range(2)]
  try:
    outs = [p.communicate(timeout=240)[0] for p in procs]
  finally:
    for p in procs:
      p.kill()
  assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
  record = json.loads((tmp_path / "mp" / "config.json").read_text())
  assert record["processes"] == 2 and record["devices"] == 2
  multi = [json.loads(l)["loss"] for l in (tmp_path / "mp" / "metrics.jsonl").read_text()
           .splitlines() if '"loss"' in l]
  np.testing.assert_allclose(multi, _losses(ref), rtol=2e-5)


def test_attention_metrics_match_the_model(corpus, tmp_path):
  """The logged attention statistics are the model's, on the same parameters and batch.

  A one-step run with learning rate ~0: the step-1 train line is the initial model on batch 0,
  and the step-0 evaluation line the initial model on the validation batch.
  """
  config = _config(steps=1, lr=1e-12, checkpoint_every=0, eval_every=0,
                   model=dataclasses.replace(TINY_MODEL, qk_norm="rms_norm"))
  train_lib.train(config, tmp_path, progress=False, corpus=corpus)
  lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  graphdef, params, _ = train_lib.init_params(config.model, config.seed)
  model = nnx.merge(graphdef, params)
  x, _ = data_lib.batch_at(corpus.train, 0, batch_size=16, seq_len=32, seed=config.seed)
  _, stats = model(jax.numpy.asarray(x), collect_stats=True)
  step1 = next(l for l in lines if l.get("step") == 1 and "loss" in l)
  np.testing.assert_allclose(step1["attn_max_logit"], stats["attn_max_logit"], rtol=1e-5)
  np.testing.assert_allclose(step1["attn_entropy"], stats["attn_entropy"], rtol=1e-5)
  xv, _ = data_lib.batch_at(corpus.valid, 0, batch_size=16, seq_len=32, seed=train_lib.EVAL_SEED)
  _, stats_v = model(jax.numpy.asarray(xv), collect_stats=True)
  val0 = next(l for l in lines if l.get("step") == 0)
  np.testing.assert_allclose(val0["val_attn_max_logit"], stats_v["attn_max_logit"], rtol=1e-5)
  off = _config(steps=1, checkpoint_every=0, log_attention=False)
  train_lib.train(off, tmp_path / "off", progress=False, corpus=corpus)
  text = (tmp_path / "off" / "metrics.jsonl").read_text()
  assert "attn_max_logit" not in text and "attn_entropy" not in text
