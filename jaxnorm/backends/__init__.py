"""Internal API: the backends and the table that chooses one for a call.

* :mod:`jaxnorm.backends.table`: ``BACKENDS``, ``PREFERENCE``, the per-platform choice and the
  dispatch (what ``impl=`` names);
* :mod:`jaxnorm.backends.interface`: the methods every backend implements;
* :mod:`jaxnorm.backends.xla`: the XLA formulas, which run every call on every platform;
* :mod:`jaxnorm.backends.triton`: the Triton kernels written in Pallas (alias ``"pallas"``).

A new backend is its own subpackage, plus its entry in ``BACKENDS`` and its place in
``PREFERENCE`` (both in :mod:`jaxnorm.backends.table`). Backends read the ops'
declarations (:mod:`jaxnorm._norm_ops`, :mod:`jaxnorm._norm_config`), never the ops' rules.
"""
