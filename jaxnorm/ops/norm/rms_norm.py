"""Public RMSNorm op: argument handling around the one ``jax.custom_jvp`` of :mod:`_ad`."""

from __future__ import annotations

from jaxnorm.backends import table as _backends
from jaxnorm.ops.norm import args as _norm_args
from jaxnorm.ops.norm import rules as _ad
from jaxnorm._norm_ops import RMS_NORM


@_backends.documented
def rms_norm(x, scale=None, *, epsilon=1e-6, axis=-1, mask=None, epsilon_placement="inside",
             zero_centered_scale=False, axis_name=None, axis_index_groups=None, dtype=None,
             impl="auto", backend_config=None, pallas=None, casting="float32",
             memory_efficient=False):
  r"""Root-mean-square normalization with hand-derived backward and tangent rules.

  .. math::

     y = \gamma \odot \frac{x}{\sqrt{\tfrac1d \sum_i x_i^2 + \epsilon}}

  over the normalized ``axis``; ``epsilon_placement="outside"`` gives
  :math:`y = \gamma \odot x / (\mathrm{rms}(x) + \epsilon)` instead and
  ``zero_centered_scale=True`` multiplies by :math:`1 + \gamma`. The backward rule is the
  closed form of the Jacobian (direct path and RMS path): with :math:`\hat x = x\,r`,
  :math:`r = (\overline{x^2} + \epsilon)^{-1/2}` and :math:`g = \gamma \odot dy`,

  .. math::

     dx = r \big(g - c\, \hat x\, \overline{g \hat x}\big), \qquad
     d\gamma = \sum_{\text{rows}} dy \odot \hat x,

  with :math:`c = 1` ("inside") or :math:`c = 1/(1 - \epsilon r)` ("outside"); derivation in
  ``docs/derivations.md``. Residuals: ``x``, ``scale`` and 4 bytes per row (``rstd``).

  Statistics and row reductions are computed in float32 (float64 for float64 inputs); ``y``
  comes back in ``dtype`` (default ``x.dtype``), cotangents in their primal's dtype. RMSNorm
  is invariant to a positive rescaling of each row, up to the effect of ``epsilon``:
  :math:`\mathrm{RMSNorm}(a x) = \mathrm{RMSNorm}(x)` for :math:`a > 0`.

  Args:
    x: ``(..., *normalized_shape)`` floating array.
    scale: ``normalized_shape`` (or ``(d,)``) array, the :math:`\gamma`; None for none.
    epsilon: Python float >= 0.
    axis: int or tuple of ints: the trailing axes to normalize over (flattened into one).
    mask: optional bool array broadcastable to ``x``: the mean square is taken over the True
      elements only; every element is still normalized.
    epsilon_placement: "inside" or "outside" (see above).
    zero_centered_scale: if True the multiplier is :math:`1 + \gamma`.
    axis_name: the axis name over which the normalized axis is split: a mesh axis inside
      ``shard_map``, or a named ``jax.vmap`` axis (derivatives included).
    axis_index_groups: optional groups of indices of ``axis_name``.
    dtype: dtype of ``y``; default ``x.dtype``.
    impl: IMPL_CHOICES (see :func:`jaxnorm.layer_norm`).
    backend_config: the config of the backend ``impl`` runs (a :class:`jaxnorm.PallasConfig`
      for the Triton kernels, a :class:`jaxnorm.backends.tpu.TpuConfig` for the TPU kernels),
      several of distinct backends as a tuple, or None; see :func:`jaxnorm.layer_norm`.
    pallas: the documented alias of ``backend_config``.
    casting: the order of casts of the affine stage (see :func:`jaxnorm.layer_norm`):
      "float32" (default), "llama" (HF ``LlamaRMSNorm``) or "t5" (HF ``T5LayerNorm``).
    memory_efficient: reverse mode keeps ``y`` and ``rstd`` instead of ``x`` (see
      :func:`jaxnorm.layer_norm`; every :math:`\gamma_i` must be nonzero). Without a bias the
      recovered :math:`\hat x = y / \gamma` loses only ``y``'s rounding, at any nonzero
      :math:`\gamma`.

  Returns:
    ``y`` with the shape of ``x``.

  Raises:
    TypeError, ValueError: as :func:`jaxnorm.layer_norm`.

  Example:
    >>> import jax, jax.numpy as jnp, jaxnorm
    >>> x = jax.random.normal(jax.random.key(0), (4, 8))
    >>> bool(jnp.allclose(jaxnorm.rms_norm(3.0 * x), jaxnorm.rms_norm(x), atol=1e-5))
    True
  """
  cfg, x2, mask2, restore = _norm_args.prepare(
      x, scale, None, op=RMS_NORM, epsilon=epsilon, axis=axis, mask=mask,
      epsilon_placement=epsilon_placement, zero_centered_scale=zero_centered_scale,
      axis_name=axis_name, axis_index_groups=axis_index_groups, dtype=dtype, impl=impl,
      backend_config=backend_config, pallas=pallas, casting=casting,
      options={"memory_efficient": memory_efficient})
  (scale,) = _norm_args.flat_params(x, x2, scale)
  return restore(_ad.apply(cfg, x2, scale, None, mask2))
