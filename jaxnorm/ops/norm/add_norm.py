r"""Public residual add + norm ops: :func:`jaxnorm.add_layer_norm`, :func:`jaxnorm.add_rms_norm`.

.. math::

   h = \mathrm{rd}_h(x + \alpha\, r), \qquad y = \mathrm{Norm}(h), \qquad
   dx = dh + J^\top dy, \qquad d r = \alpha\, dx.

Argument handling around the one ``jax.custom_jvp`` of :mod:`jaxnorm.ops.norm.rules`; the forward
and the derived backward are in :mod:`jaxnorm.backends.table`.
"""

from __future__ import annotations

from jaxnorm.backends import table as _backends
from jaxnorm.ops.norm import rules as _ad
from jaxnorm.ops.norm import args as _norm_args
from jaxnorm._norm_ops import LAYER_NORM, RMS_NORM

__all__ = ["add_layer_norm", "add_rms_norm"]


@_backends.documented
def add_layer_norm(x, residual, scale=None, bias=None, *, residual_scale=1.0, residual_dtype=None,
                   epsilon=1e-6, axis=-1, mask=None, epsilon_placement="inside",
                   zero_centered_scale=False, axis_name=None, axis_index_groups=None, dtype=None,
                   impl="auto", backend_config=None, pallas=None, casting="float32",
                   use_fast_variance=False):
  r"""Residual add fused with LayerNorm: returns ``(y, h)``.

  .. math::

     h = x + \alpha\, r, \qquad
     y = \gamma \odot \frac{h - \mu}{\sqrt{\sigma^2 + \epsilon}} + \beta

  with :math:`\alpha` = ``residual_scale`` and the statistics of ``h`` over ``axis``, exactly as
  :func:`jaxnorm.layer_norm` of ``h``. Typical use, a Pre-LN block (``h`` is the residual
  stream, ``y`` the next sub-layer's input)::

    y, h = jaxnorm.add_layer_norm(attn_out, h, scale, bias)   # h += attn_out; y = LN(h)

  Backward rule (derived in ``docs/derivations.md``, "Fused residual add"): with ``dy``, ``dh``
  the cotangents of the two outputs and :math:`J^\top dy` the plain LayerNorm backward at
  ``h``,

  .. math::

     dx = dh + J^\top dy, \qquad d\text{residual} = \alpha\,(dh + J^\top dy),

  each cast to its primal's dtype; ``dscale``, ``dbias`` as :func:`jaxnorm.layer_norm`.
  Residuals: the plain op's on ``h`` (``h`` is the output buffer; ``x`` and ``residual`` are
  not kept).

  Args:
    x: ``(..., *normalized_shape)`` floating array: the new contribution (a sub-layer output).
    residual: floating array of the same shape: the residual stream.
    scale: ``normalized_shape`` (or ``(d,)``) array, the :math:`\gamma`; None for none.
    bias: ``normalized_shape`` (or ``(d,)``) array, the :math:`\beta`; None for none.
    residual_scale: Python float :math:`\alpha` multiplying ``residual`` (DeepNorm's
      :math:`x_{l+1} = \mathrm{LN}(\alpha x_l + F(x_l))` is ``add_layer_norm(F(x_l), x_l,
      residual_scale=alpha)``). Default 1.
    residual_dtype: dtype ``h`` is stored in (and the statistics are taken of); default the
      promoted dtype of ``x`` and ``residual``. A float32 stream under bfloat16 activations is
      the common use. The add runs in at least float32 and is rounded once.
    epsilon, axis, mask, epsilon_placement, zero_centered_scale, axis_name, axis_index_groups,
      use_fast_variance: as :func:`jaxnorm.layer_norm` (the statistics are those of ``h``).
    dtype: dtype of ``y``; default ``x.dtype`` (the activations' dtype, not the stream's).
    impl: IMPL_CHOICES. "triton" (alias "pallas") and "tpu" run fused
      kernels (one read of ``x`` and ``residual``, one write of ``h`` and ``y``); "auto": the
      fused Triton kernels on a GPU where the plain op's kernels apply (compiled and tested on
      an H100), "xla" otherwise (see :func:`jaxnorm.layer_norm`).
    backend_config: the config of the backend ``impl`` runs, or None, as
      :func:`jaxnorm.layer_norm`; ``pallas``: its documented alias.
    casting: the order of casts of the norm's affine stage, as :func:`jaxnorm.layer_norm`
      (for "llama" the normalized ``h`` is rounded to ``h``'s dtype, ``residual_dtype``).

  Returns:
    ``(y, h)``: ``y`` in ``dtype``, ``h`` in ``residual_dtype``, both the shape of ``x``.

  Raises:
    TypeError: ``x``/``residual`` not floating, ``residual_dtype`` not a floating dtype,
      ``residual_scale`` not a real number (or a traced array); otherwise as
      :func:`jaxnorm.layer_norm`.
    ValueError: ``residual`` not the shape of ``x``, ``residual_scale`` not a scalar or not
      finite; otherwise as :func:`jaxnorm.layer_norm` (the float range applies to ``h``).

  Example:
    >>> import jax, jax.numpy as jnp, jaxnorm
    >>> x, r = jax.random.normal(jax.random.key(0), (2, 4, 8))
    >>> y, h = jaxnorm.add_layer_norm(x, r, jnp.ones(8), jnp.zeros(8))
    >>> y_plain = jaxnorm.layer_norm(h, jnp.ones(8), jnp.zeros(8))
    >>> bool(jnp.allclose(h, x + r)), bool(jnp.allclose(y, y_plain))
    (True, True)
  """
  return _call(x, residual, scale, bias, op=LAYER_NORM, residual_scale=residual_scale,
               residual_dtype=residual_dtype, epsilon=epsilon, axis=axis, mask=mask,
               epsilon_placement=epsilon_placement, zero_centered_scale=zero_centered_scale,
               axis_name=axis_name, axis_index_groups=axis_index_groups, dtype=dtype, impl=impl,
               backend_config=backend_config, pallas=pallas, casting=casting,
               options={"use_fast_variance": use_fast_variance})


def add_rms_norm(x, residual, scale=None, *, residual_scale=1.0, residual_dtype=None,
                 epsilon=1e-6, axis=-1, mask=None, epsilon_placement="inside",
                 zero_centered_scale=False, axis_name=None, axis_index_groups=None, dtype=None,
                 impl="auto", backend_config=None, pallas=None, casting="float32"):
  r"""Residual add fused with RMSNorm: returns ``(y, h)``.

  .. math::

     h = x + \alpha\, r, \qquad y = \gamma \odot \frac{h}{\sqrt{\tfrac1d \sum_i h_i^2 + \epsilon}}

  exactly as :func:`jaxnorm.rms_norm` of ``h`` (vLLM's ``fused_add_rms_norm``, functionally).
  Backward rule: :math:`dx = dh + J^\top dy`, :math:`d\text{residual} = \alpha\, dx`, with
  :math:`J^\top dy` the plain RMSNorm backward at ``h`` (``docs/derivations.md``).

  Args:
    x: ``(..., *normalized_shape)`` floating array: the new contribution.
    residual: floating array of the same shape: the residual stream.
    scale: ``normalized_shape`` (or ``(d,)``) array, the :math:`\gamma`; None for none.
    residual_scale, residual_dtype, dtype: as :func:`add_layer_norm`.
    epsilon, axis, mask, epsilon_placement, zero_centered_scale, axis_name, axis_index_groups,
      impl, backend_config, pallas, casting: as :func:`jaxnorm.rms_norm`.

  Returns:
    ``(y, h)``: ``y`` in ``dtype`` (default ``x.dtype``), ``h`` in ``residual_dtype``.

  Raises:
    TypeError, ValueError: as :func:`add_layer_norm`.

  Example:
    >>> import jax, jax.numpy as jnp, jaxnorm
    >>> x = jax.random.normal(jax.random.key(0), (4, 8), jnp.bfloat16)
    >>> r = jnp.zeros((4, 8), jnp.float32)
    >>> y, h = jaxnorm.add_rms_norm(x, r, residual_dtype=jnp.float32)
    >>> y.dtype, h.dtype
    (dtype(bfloat16), dtype('float32'))
  """
  return _call(x, residual, scale, None, op=RMS_NORM, residual_scale=residual_scale,
               residual_dtype=residual_dtype, epsilon=epsilon, axis=axis, mask=mask,
               epsilon_placement=epsilon_placement, zero_centered_scale=zero_centered_scale,
               axis_name=axis_name, axis_index_groups=axis_index_groups, dtype=dtype, impl=impl,
               backend_config=backend_config, pallas=pallas, casting=casting)


def _call(x, residual, scale, bias, **kw):
  """Both public ops: prepare once, the parameters as the op takes them, ``(y, h)`` reshaped."""
  cfg, x2, r2, mask2, restore = _norm_args.prepare_add(x, residual, scale, bias, **kw)
  scale, bias = _norm_args.flat_params(x, x2, scale, bias)
  y, h = _ad.add_norm(cfg, x2, r2, scale, bias, mask2)
  return restore(y), restore(h)
