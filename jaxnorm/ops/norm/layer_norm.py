"""Public LayerNorm op: argument handling around the one ``jax.custom_jvp`` of :mod:`_ad`."""

from __future__ import annotations

from jaxnorm.backends import table as _backends
from jaxnorm.ops.norm import args as _norm_args
from jaxnorm.ops.norm import rules as _ad
from jaxnorm._norm_ops import LAYER_NORM


@_backends.documented
def layer_norm(x, scale=None, bias=None, *, epsilon=1e-6, axis=-1, mask=None,
               epsilon_placement="inside", zero_centered_scale=False, axis_name=None,
               axis_index_groups=None, dtype=None, impl="auto", backend_config=None,
               pallas=None, casting="float32", use_fast_variance=False, memory_efficient=False):
  r"""Layer normalization with hand-derived backward and tangent rules.

  .. math::

     y = \gamma \odot \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} + \beta, \qquad
     \mu = \frac1d \sum_i x_i, \quad \sigma^2 = \frac1d \sum_i (x_i - \mu)^2

  over the normalized ``axis``. ``jax.grad`` runs the hand-derived VJP and ``jax.jvp`` the
  hand-derived tangent (one ``jax.custom_jvp``, :mod:`jaxnorm.ops.norm.rules`), each differentiable
  again to any order; both, with the masked and "outside" variants, are derived in
  ``docs/derivations.md``. Residuals: ``x``, ``scale`` and 12 bytes per row (a float32 pivot,
  the mean's offset from it, and ``rstd``).

  Statistics and the backward's row reductions are computed in float32 (float64 for float64
  inputs) with a shifted-data variance that stays exact to float32 rounding for mean/std
  ratios of ``1e4`` and beyond. ``y`` comes back in ``dtype`` (default ``x.dtype``), every
  cotangent in the dtype of its primal.

  Args:
    x: ``(..., *normalized_shape)`` floating array.
    scale: ``normalized_shape`` (or ``(d,)``) array, the :math:`\gamma`; None for none.
    bias: ``normalized_shape`` (or ``(d,)``) array, the :math:`\beta`; None for none.
    epsilon: Python float >= 0 added to the variance.
    axis: int or tuple of ints: the trailing axes to normalize over (flattened into one).
    mask: optional bool array broadcastable to ``x``: statistics over the True elements only
      (``n`` of them instead of ``d``); every element is still normalized. A row with no True
      element has undefined statistics (NaN), as in Flax.
    epsilon_placement: "inside" (:math:`1/\sqrt{\sigma^2 + \epsilon}`) or "outside"
      (:math:`1/(\sigma + \epsilon)`).
    zero_centered_scale: if True the multiplier is :math:`1 + \gamma` (parameters stored as
      offsets from one, Gemma style).
    axis_name: the axis name over which the normalized axis is split: a mesh axis inside
      ``shard_map``, or a named ``jax.vmap`` axis (derivatives included);
      statistics and the backward's two row reductions are summed over it with ``psum``.
    axis_index_groups: optional groups of indices of ``axis_name`` (as in ``lax.psum``).
    dtype: dtype of ``y``; default ``x.dtype``.
    impl: IMPL_CHOICES. "xla": XLA ops, on every platform; "triton": the
      Triton kernels of :mod:`jaxnorm.backends.triton`, for GPUs ("pallas" is its alias, the
      same behaviour); "tpu": the Pallas TPU kernels of :mod:`jaxnorm.backends.tpu`
      (``docs/tpu.md``). "auto" takes the Triton kernels on a GPU where they apply (no mask,
      no axis_name, not traced under a mesh with non-manual axes, a supported dtype) and XLA
      otherwise (on a TPU too, until the TPU kernels are measured there); it never fails where
      "xla" works.
    backend_config: the config of the backend ``impl`` runs, an instance of that backend's
      config class (the Triton kernels': a :class:`jaxnorm.PallasConfig` saying how they run,
      interpret mode and a block configuration; the TPU kernels': a
      :class:`jaxnorm.backends.tpu.TpuConfig`), or a tuple of configs of distinct backends;
      None for the defaults (compiled, the heuristic's blocks). Checked against the backend
      the call resolves to (a ``TypeError`` names the argument and that backend: a config of
      a backend the call cannot run is refused, not dropped); under "auto" each applies where
      its backend runs, and XLA has none.
    pallas: the documented alias of ``backend_config`` for the Triton kernels' config only
      (give one of them, not both).
    casting: where the affine stage rounds: "float32" (default; one cast at the end),
      "llama" (HF ``LlamaRMSNorm``) or "t5" (HF ``T5LayerNorm``); the order of casts of each
      mode and its backward: ``docs/modules.md`` and ``docs/derivations.md``.
    use_fast_variance: if True the variance is Flax's ``E[x^2] - E[x]^2`` (clamped at 0) instead
      of the shifted-data form: in float32 it loses about ``2 log2(mean/std)`` bits (nothing
      left at a ratio of ``1e4``); the backward and tangent are the derived ones at the
      statistics it computed. Runs on XLA ("auto" never takes the kernels with it).
    memory_efficient: if True reverse mode keeps ``y`` and ``rstd`` instead of ``x`` and
      recovers :math:`\hat x = (y - \beta) / \gamma` in the backward (NVIDIA Apex's option of
      that name; ``docs/derivations.md``): one ``x``-sized array less per call where ``y`` is
      kept anyway (by the next layer). Every :math:`\gamma_i` must be nonzero: a ``scale``
      whose value is concrete (eager, differentiated or not) with a zero raises a
      ``ValueError``; a traced one gives NaN in that feature's ``dx`` column and ``dscale``
      entry only (documented). The recovered :math:`\hat x` loses about
      :math:`\log_2 \max_j |\beta_j / \gamma_j|` bits of ``y``'s; beyond a ratio of
      ``2 ** (p // 2)`` for ``y``'s ``p`` significand bits (float32 4096, float16 32, bfloat16
      16) less than half are left, and dx/dscale lose as much: a concrete ``scale`` and ``bias``
      beyond it give a ``RuntimeWarning``; under ``jit`` nothing is checked, so keep the ratio
      below it (or use a wider ``dtype``). Runs on XLA ("auto" never takes the kernels with it).

  Returns:
    ``y`` with the shape of ``x``.

  Raises:
    TypeError: ``x``, ``scale``, ``bias`` not floating; ``mask`` not boolean; ``epsilon`` not a
      Python number; ``zero_centered_scale``, ``use_fast_variance`` or ``memory_efficient`` not
      a bool.
    ValueError: ``scale``/``bias`` shape not the normalized shape, ``axis`` out of range or not
      trailing, ``epsilon`` negative, NaN, or past the statistics' float range (above ``1 / (2
      finfo.tiny)``, 4.3e37 for float32 statistics, eager or traced), unknown
      ``epsilon_placement``/``impl``/``casting``, ``impl="pallas"`` with ``use_fast_variance=True``
      or ``memory_efficient=True``; a concrete ``scale`` with a zero :math:`\gamma_i` and
      ``memory_efficient=True``; ``axis_name`` not bound (outside ``shard_map`` or a named
      ``vmap``); a concrete row past the float range: largest magnitude :math:`\ge \sqrt{\max/(4d)}`
      of the compute dtype (float32: ``3.3e18`` at ``d = 8``), or, with ``epsilon=0``, nonzero and
      below :math:`\sqrt{d\,\mathrm{tiny}}` (``docs/derivations.md``, "Where the float range ends").
      A traced row past it cannot raise: it comes back NaN in ``y`` and ``dx`` (and makes all of
      ``dscale`` NaN), never finite zeros; a tiny one inf/NaN; other rows are unaffected.
    TypeError also for an 8-bit float ``x`` (cast to bfloat16 first; an 8-bit ``scale``,
      ``bias`` or ``dtype`` is allowed).

  Example:
    >>> import jax, jax.numpy as jnp, jaxnorm
    >>> x = jax.random.normal(jax.random.key(0), (4, 8))
    >>> y = jaxnorm.layer_norm(x, jnp.ones(8), jnp.zeros(8))
    >>> bool(jnp.allclose(y.mean(-1), 0, atol=1e-6))
    True
  """
  cfg, x2, mask2, restore = _norm_args.prepare(
      x, scale, bias, op=LAYER_NORM, epsilon=epsilon, axis=axis, mask=mask, dtype=dtype,
      impl=impl, epsilon_placement=epsilon_placement, zero_centered_scale=zero_centered_scale,
      axis_name=axis_name, axis_index_groups=axis_index_groups, backend_config=backend_config,
      pallas=pallas, casting=casting,
      options={"use_fast_variance": use_fast_variance, "memory_efficient": memory_efficient})
  scale, bias = _norm_args.flat_params(x, x2, scale, bias)
  return restore(_ad.apply(cfg, x2, scale, bias, mask2))
