"""Internal API: the backends and the table that chooses one for a call.

* :mod:`jaxnorm.backends.table`: ``BACKENDS``, ``PREFERENCE``, the per-platform choice, the
  backend config's checks and the one dispatch (what ``impl=`` and ``backend_config=`` name);
* :mod:`jaxnorm.backends.interface`: the methods every backend implements, and ``Entry``;
* :mod:`jaxnorm.backends.xla`: the XLA statistics and formulas, which run every call on every
  platform;
* :mod:`jaxnorm.backends.triton`: the Triton kernels written in Pallas (alias ``"pallas"``);
* :mod:`jaxnorm.backends.tpu`: the Pallas TPU (Mosaic) kernels;
* :mod:`jaxnorm.backends._kernel_primitive` and :mod:`jaxnorm.backends._kernel_common`: what the
  kernel backends share (the primitive their kernels run behind, the refusals, the per-head
  mapping, the probe of a Pallas module); they import no backend.

Each backend's package is the one home of its arithmetic for each op it runs (``docs/ops.md``).
A new backend is its own subpackage, plus its entry in ``BACKENDS`` and its place in
``PREFERENCE`` (both in :mod:`jaxnorm.backends.table`), or one call of
:func:`jaxnorm.backends.table.register_backend` from outside. Backends read the ops'
declarations (:mod:`jaxnorm._norm_ops`, :mod:`jaxnorm._norm_config`), never ``jaxnorm.ops``.
"""
