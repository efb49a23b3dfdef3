"""Internal API: the pointwise family: ``rules`` (the declaration class ``Squash``, the family's
formulas and derived rules, written once) and one module per op (``dyt``, ``derf``: its
declaration, public function, Jacobian and layer docstrings), each named by its entry of
:data:`jaxnorm.OPS` (``docs/adding-an-op.md``)."""
