"""Backends declare what they run: platforms, config class, an allow-list of ops; impl="auto"
walks the preference list; a kernel never runs an op it does not implement (exported for cuda
from this CPU host, an op without a kernel carries no Triton call); "pallas" names "triton"."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnorm
from jaxnorm.ops.norm import rules as _ad
from jaxnorm.backends import table as _backends
from jaxnorm.ops.norm import args as _norm_args
from jaxnorm._norm_ops import LAYER_NORM, RMS_NORM
from jaxnorm.backends.triton import backend as triton_backend
from jaxnorm.backends.tpu import TpuConfig
from jaxnorm.backends.xla.backend import register_norm_op
from jaxnorm.backends.xla.formulas import FORWARD_VIEWS
from jaxnorm.backends.xla.statistics import STATISTICS
from _backends import lowered_for

TRITON_CALL = "__gpu$xla.gpu.triton"
# An op of the norm family that the kernels do not implement: RMSNorm's statistics under another
# name (the kernels would compute it right, but they were never told so: the allow-list decides).
NO_KERNEL = dataclasses.replace(RMS_NORM, name="rms_norm_without_kernel")
# Its XLA entries: RMSNorm's statistics and the family's roles, registered as a new norm op
# registers them.
register_norm_op(NO_KERNEL.name, STATISTICS[RMS_NORM.name])


def _op(decl, impl):
  def f(x, scale):
    cfg, x2, mask2, restore = _norm_args.prepare(
        x, scale, None, op=decl, epsilon=1e-6, axis=-1, mask=None, epsilon_placement="inside",
        zero_centered_scale=False, axis_name=None, axis_index_groups=None, dtype=None, impl=impl)
    return restore(_ad.apply(cfg, x2, scale, None, mask2))
  return f


def _exported(f, platform, *args):
  """The program lowered for ``platform`` (a jit's lowering: an export of impl="auto" takes the
  XLA path everywhere, tests/jaxnorm/test_export.py)."""
  return lowered_for(f, (platform,), *args)


def _args():
  return jax.random.normal(jax.random.key(0), (16, 128)), jnp.linspace(0.5, 1.5, 128)


def _grad(f):
  return jax.grad(lambda x, s: jnp.sum(f(x, s) ** 2), argnums=(0, 1))


def test_backends_declare_platforms_config_and_allow_list():
  xla, triton, tpu = (_backends.BACKENDS[n] for n in ("xla", "triton", "tpu"))
  assert xla.platforms is None and xla.config_class is None
  assert triton.platforms == ("cuda", "rocm") and triton.config_class is jaxnorm.PallasConfig
  assert triton.auto_platforms == triton.platforms  # the default: its platforms
  # The TPU backend is in auto's order, its platforms held back by its switch (goal 4).
  assert tpu.platforms == ("tpu",) and tpu.config_class is TpuConfig and tpu.auto_platforms == ()
  kernel_ops = {op for op, role in triton_backend.TRITON.table if role == "forward"}
  assert kernel_ops == {LAYER_NORM.name, RMS_NORM.name, "gated_rms_norm"}
  assert dict(_backends.PLATFORM_BACKENDS) == {"cuda": "triton", "rocm": "triton"}
  assert _backends.PREFERENCE == ("triton", "tpu", "xla") and _backends.ALIASES["pallas"] == "triton"
  call = ((16, 128), jnp.float32)
  assert triton.supports(RMS_NORM, *call) and xla.supports(NO_KERNEL, *call)
  assert not triton.supports(NO_KERNEL, *call)
  assert "do not implement rms_norm_without_kernel" in triton.refusal(*call, None, None, NO_KERNEL)
  # A backend's tuning lives in the backend, not in the op's declaration.
  assert FORWARD_VIEWS == {LAYER_NORM.name} and not hasattr(LAYER_NORM, "xla_forward_views")


@pytest.mark.parametrize("mode", ["forward", "grad"])
def test_an_op_without_a_kernel_lowered_for_cuda_carries_no_kernel(mode, gpu_host):
  x, s = _args()
  wrap = (lambda f: f) if mode == "forward" else _grad
  assert _exported(wrap(_op(RMS_NORM, "auto")), "cuda", x, s).count(TRITON_CALL) >= 1  # control
  text = _exported(wrap(_op(NO_KERNEL, "auto")), "cuda", x, s)
  assert TRITON_CALL not in text and "jaxnorm_kernels" not in text
  got = jax.jit(wrap(_op(NO_KERNEL, "auto")))(x, s)
  want = jax.jit(wrap(_op(RMS_NORM, "xla")))(x, s)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("impl", ["triton", "pallas"])
def test_naming_the_kernels_for_an_op_they_lack_raises(impl):
  x, s = _args()
  with pytest.raises(ValueError, match=rf"impl='{impl}' cannot run this call: the Pallas kernels do not implement "
                                       r"rms_norm_without_kernel\. Use impl='xla' or 'auto'\."):
    _op(NO_KERNEL, impl)(x, s)


def test_triton_and_its_alias_pallas_export_the_same_kernels():
  x, s = _args()
  texts = [_exported(_grad(lambda x, s, impl=impl: jaxnorm.rms_norm(x, s, impl=impl)), "cuda", x, s)
           for impl in ("triton", "pallas")]
  assert texts[0].count(TRITON_CALL) == texts[1].count(TRITON_CALL) >= 2


def test_an_unknown_impl_names_the_choices():
  assert _backends.IMPLS == ("auto", "xla", "triton", "tpu", "pallas")
  with pytest.raises(ValueError, match=r"impl must be one of \('auto', 'xla', 'triton', 'tpu', "
                                       r"'pallas'\), got 'mosaic'"):
    jaxnorm.rms_norm(jnp.ones((2, 8)), impl="mosaic")


def test_a_backend_config_is_checked_against_the_backends_config_classes():
  """``backend_config=`` is checked against the backends' ``config_class`` (no op names one),
  ``pallas=`` against the Triton backend's only, and each config carried to its backend, one per
  backend the call runs on (sorted ``(name, config)`` pairs); none is dropped silently."""
  x = jnp.ones((4, 8))
  with pytest.raises(TypeError, match=r"pallas must be a jaxnorm.PallasConfig or None, got str"):
    jaxnorm.layer_norm(x, pallas="fast")
  with pytest.raises(TypeError, match=r"pallas must be a jaxnorm.PallasConfig or None"):
    jaxnorm.gated_rms_norm(x, x, pallas=3)
  with pytest.raises(TypeError, match=r"^pallas must be a jaxnorm.PallasConfig or None, got "
                                      r"TpuConfig"):  # the alias is the Triton config's only
    jaxnorm.rms_norm(x, impl="tpu", pallas=TpuConfig(interpret=True))
  with pytest.raises(TypeError, match=r"^backend_config must be a backend's config \(PallasConfig, "
                                      r"TpuConfig\), a tuple of configs of distinct backends"):
    jaxnorm.rms_norm(x, backend_config=(TpuConfig(), "fast"))
  with pytest.raises(ValueError, match=r"^backend_config= holds two configs of the 'triton' "
                                       r"backend"):
    jaxnorm.rms_norm(x, backend_config=(jaxnorm.PallasConfig(), jaxnorm.PallasConfig()))
  given, tpu = jaxnorm.PallasConfig(interpret=True), TpuConfig(interpret=True)
  configs, argument = _backends.check_config([tpu, given])
  assert configs == (tpu, given) and argument == "backend_config"
  assert _backends.check_config(None, given) == ((given,), "pallas")
  # Each backend the call runs on gets its own, or its default; XLA carries none.
  assert _backends.call_config(configs, (), "auto") == ()
  assert _backends.call_config(configs, ("tpu", "triton"), "auto") == (
      ("tpu", tpu), ("triton", given))
  assert _backends.call_config((given,), ("tpu", "triton"), "auto") == (
      ("tpu", TpuConfig()), ("triton", given))
  assert _backends.call_config((), ("triton",), "pallas") == (("triton", jaxnorm.PallasConfig()),)
  # A config of the wrong type names the backend impl resolved to.
  with pytest.raises(TypeError, match=r"^backend_config= is a TpuConfig, which does not configure "
                                      r"the 'triton' backend that impl='pallas' runs \(TpuConfig "
                                      r"configures the 'tpu' backend\); pass a PallasConfig"):
    jaxnorm.rms_norm(x, impl="pallas", backend_config=tpu)
  with pytest.raises(TypeError, match=r"^backend_config= is a PallasConfig, which does not "
                                      r"configure the 'tpu' backend that impl='tpu' runs"):
    jaxnorm.rms_norm(x, impl="tpu", backend_config=(tpu, given))
  # impl="xla" runs no backend config: one given is refused, not dropped.
  with pytest.raises(TypeError, match=r"^pallas= is a PallasConfig, which does not configure the "
                                      r"'xla' backend that impl='xla' runs \(PallasConfig "
                                      r"configures the 'triton' backend\); it takes no config"):
    jaxnorm.rms_norm(x, impl="xla", pallas=given)
  # "auto" carries a config of any backend of PREFERENCE where that backend runs; on this CPU
  # host it runs XLA (the documented rule), so the call carries none.
  cfg = _norm_args.prepare(
      x, None, None, op=RMS_NORM, epsilon=1e-6, axis=-1, mask=None, epsilon_placement="inside",
      zero_centered_scale=False, axis_name=None, axis_index_groups=None, dtype=None,
      impl="auto", backend_config=(tpu, given))[0]
  assert cfg.impl == "xla" and cfg.backend_config == ()


def test_the_default_refusal_reads_the_backends_own_table():
  """A backend's default refusal: an op without entries in its table refused by name, then the
  op's own ``"refusal"`` entry asked; a backend with an entry but no refusal takes the call."""
  from jaxnorm.backends.interface import Backend

  class Partial(Backend):
    name = "partial"

  b = Partial()
  b.register(RMS_NORM.name, forward=lambda *a: None)
  b.register(LAYER_NORM.name, forward=lambda *a: None,
             refusal=lambda op, shape, dtype, options: f"no {op.name} at {shape}")
  call = ((16, 128), jnp.float32, None, None)
  assert b.refusal(*call, RMS_NORM) is None
  assert b.refusal(*call, LAYER_NORM) == "no layer_norm at (16, 128)"
  assert b.refusal(*call, NO_KERNEL) == "the partial backend does not implement " + NO_KERNEL.name
  assert not b.supports(NO_KERNEL, (16, 128), jnp.float32)


def test_two_kernel_backends_auto_decides_per_platform(monkeypatch, gpu_host):
  """With the TPU backend's switch on, "auto" holds both kernel backends, each with its own
  config: a program lowered for cuda and tpu carries the Triton kernels in one branch and the
  TPU kernels in the other; a call the TPU kernels refuse (float16) keeps the Triton branch,
  and the tpu platform runs XLA."""
  from jaxnorm.backends.tpu import TPU
  monkeypatch.setattr(TPU, "auto_on_tpu", True)
  assert dict(_backends.PLATFORM_BACKENDS) == {"cuda": "triton", "rocm": "triton", "tpu": "tpu"}
  x, s = _args()

  def grad(dtype, **kw):
    return _grad(lambda x, s: jaxnorm.rms_norm(x.astype(dtype), s, **kw).astype(jnp.float32))

  cfg = (TpuConfig(block_rows=8), jaxnorm.PallasConfig())
  both = lowered_for(grad(jnp.float32, backend_config=cfg), ("cuda", "tpu"), x, s)
  assert both.count(TRITON_CALL) >= 2 and both.count("tpu_custom_call") == 2
  half = lowered_for(grad(jnp.float16), ("cuda", "tpu"), x, s)
  assert half.count(TRITON_CALL) >= 2 and "tpu_custom_call" not in half
  # A JAX without Pallas's Triton module (blocked; the probe asked): on a GPU host, whose own
  # backend cannot run, "auto" is XLA everywhere (trace-time rule, issue 62); on a TPU host the
  # TPU branch stays.
  import sys
  import warnings
  from jaxnorm.backends.triton import compat
  monkeypatch.setitem(sys.modules, "jax.experimental.pallas.triton", None)
  monkeypatch.setattr(_backends, "_WARNED", {"triton"})  # warned already: no warning here
  compat.missing.cache_clear()
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      on_gpu = lowered_for(grad(jnp.float32), ("cuda", "tpu"), x, s)
      monkeypatch.setattr(_backends, "host_platform", lambda: "tpu")
      on_tpu = lowered_for(grad(jnp.float32), ("cuda", "tpu"), x, s)
  finally:
    monkeypatch.delitem(sys.modules, "jax.experimental.pallas.triton", raising=False)
    compat.missing.cache_clear()
  assert TRITON_CALL not in on_gpu and "tpu_custom_call" not in on_gpu
  assert TRITON_CALL not in on_tpu and on_tpu.count("tpu_custom_call") == 2


def test_the_impl_choices_of_the_docstrings_come_from_the_table():
  """Every public op and layer that documents ``impl=`` lists the table's choices, formatted
  from :data:`IMPLS` when imported (``table.documented``), and no docstring keeps the token."""
  import jaxnorm.linen as jln
  import jaxnorm.nnx as jnn
  choices = _backends.impl_choices()
  assert all(f'``"{name}"``' in choices for name in _backends.IMPLS)
  documented = [jaxnorm.layer_norm, jaxnorm.rms_norm, jaxnorm.add_layer_norm,
                jaxnorm.gated_rms_norm, jnn, jln, jnn.LayerNorm, jnn.RMSNorm, jnn.GatedRMSNorm,
                jln.LayerNorm, jln.RMSNorm]
  for obj in documented:
    assert choices in obj.__doc__, obj
  publics = [getattr(m, n) for m in (jaxnorm, jnn, jln) for n in dir(m) if not n.startswith("_")]
  for obj in publics + [jaxnorm, jnn, jln]:
    assert _backends.IMPL_TOKEN not in (getattr(obj, "__doc__", None) or ""), obj
