"""Internal API: the ``"xla"`` backend: ``formulas`` (the closed forms in XLA ops, written once
for the norm family), ``gated`` (gated RMSNorm's) and ``backend`` (the table entry, which
registers both)."""
