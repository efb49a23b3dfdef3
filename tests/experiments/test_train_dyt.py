"""Issue 36's additions to the harness: nested unique-byte subsets (``train_bytes``), the final model
scored on its own training bytes (``eval_train``), the DyT/Derf saturation statistic, and weight decay
that spares DyT/Derf's alpha and shift."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from experiments.harness import data as data_lib
from experiments.harness import train as train_lib
from experiments.harness import train_config
from experiments.harness.train_config import TrainConfig
from jaxnorm.models import TransformerConfig, TransformerLM

TEXT = "".join(f"def g{i % 11}(y):\n    return y - {i % 7} * {i % 3}  # lazy dogs jump\n" for i in range(600))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  path = tmp_path_factory.mktemp("data") / "tiny.txt"
  path.write_text(TEXT)
  return data_lib.load_corpus(str(path))


def _model(norm_type, **kw):
  return TransformerConfig(d_model=32, n_layers=2, n_heads=2, d_ff=64, max_len=32, norm_type=norm_type, **kw)


def test_train_subset_is_nested_sized_and_spread_over_the_split():
  train = np.arange(200 * data_lib.SUBSET_CHUNK, dtype=np.int64)   # every byte's value is its position
  small, big = data_lib.train_subset(train, 3000), data_lib.train_subset(train, 20000)
  assert small.size == 3000 and big.size == 20000
  np.testing.assert_array_equal(big[:3000], small)                     # nested: a prefix of the larger one
  assert data_lib.train_subset(train, None) is train and data_lib.train_subset(train, 10 ** 9) is train
  starts = big[::data_lib.SUBSET_CHUNK]
  assert np.all(starts % data_lib.SUBSET_CHUNK == 0) and len(set(starts.tolist())) == starts.size  # whole chunks
  assert max(starts) > train.size // 2 and min(starts) < train.size // 2  # chunks from all over the split
  with pytest.raises(ValueError, match="at least"):
    data_lib.train_subset(train, data_lib.SUBSET_CHUNK)


@pytest.mark.parametrize("norm_type", ["dyt", "derf"])
def test_weight_decay_spares_alpha_shift_scale_and_bias(norm_type):
  _, params, _ = train_lib.init_params(_model(norm_type), 0)
  mask = train_config.decay_mask(params)
  flat = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(mask)}
  pointwise = [k for k in flat if any(n in k for n in ("['alpha']", "['shift']", "['scale']"))
               or k.endswith("['bias']")]
  assert any("['alpha']" in k for k in pointwise) and all(flat[k] is False for k in pointwise)
  assert ("['shift']" in "".join(pointwise)) == (norm_type == "derf")
  assert flat["['blocks']['mlp']['fc_in']['kernel']"] is True and flat["['embed']['embedding']"] is True
  assert "alpha" in train_config.NO_DECAY_NAMES and "shift" in train_config.NO_DECAY_NAMES


def test_saturation_statistic_counts_arguments_beyond_two():
  cfg = _model("derf", pointwise_alpha=(1.0, 1.0), fuse_residual_norm=False)
  model = TransformerLM(cfg, rngs=nnx.Rngs(0))
  tokens = jnp.arange(32, dtype=jnp.int32).reshape(2, 16) % 256
  _, stats = model(tokens, collect_stats=True)
  assert stats["saturation"].shape == stats["residual_sq_norm"].shape == (2 * 2 + 1,)
  # The first norm input is the model input h0 = E[tokens] + P: count |alpha h0 + s| > 2 by hand.
  h0 = model.embed(tokens) + model.pos_embed[...][None, :16]
  alpha, shift = model.blocks.attn_norm.alpha[...][0], model.blocks.attn_norm.shift[...][0]
  want = float(jnp.mean(jnp.abs(alpha * h0 + shift) > 2.0))
  assert float(stats["saturation"][0]) == pytest.approx(want, abs=1e-6)
  fused = TransformerLM(_model("derf", pointwise_alpha=(1.0, 1.0)), rngs=nnx.Rngs(0))
  np.testing.assert_allclose(fused(tokens, collect_stats=True)[1]["saturation"], stats["saturation"], atol=1e-6)
  _, ln_stats = TransformerLM(_model("layer_norm"), rngs=nnx.Rngs(0))(tokens, collect_stats=True)
  assert "saturation" not in ln_stats


def test_train_bytes_and_eval_train(corpus, tmp_path):
  tc = TrainConfig(model=_model("dyt"), steps=4, batch_size=4, seq_len=16, lr=3e-3, eval_every=0, eval_batches=2,
                   train_bytes=2 * data_lib.SUBSET_CHUNK, eval_train=True, log_attention=False)
  s = train_lib.train(tc, tmp_path / "a", progress=False, corpus=corpus)
  assert s["train_bytes"] == 2 * data_lib.SUBSET_CHUNK
  assert np.isfinite(s["final_train_loss"]) and len(s["final_saturation"]) == 5
  assert all(0.0 <= x <= 1.0 for x in s["final_saturation"])
  # Training reads only the subset: the first batch is a window of it.
  sub = data_lib.train_subset(corpus.train, tc.train_bytes)
  x, _ = data_lib.batch_at(sub, 0, batch_size=4, seq_len=16, seed=0)
  assert bytes(x[0].astype(np.uint8)) in bytes(sub)
  plain = train_lib.train(TrainConfig(model=_model("layer_norm"), steps=2, batch_size=4, seq_len=16, eval_every=0,
                                      eval_batches=1, log_attention=False), tmp_path / "b", progress=False,
                          corpus=corpus)
  assert plain["final_train_loss"] is None and plain["final_saturation"] is None
  assert plain["train_bytes"] == corpus.train.size
  with pytest.raises(TypeError, match="eval_train must be a bool"):
    TrainConfig(model=_model("dyt"), seq_len=16, eval_train=1)
