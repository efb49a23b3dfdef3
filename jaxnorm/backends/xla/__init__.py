"""Internal API: the ``"xla"`` backend: ``formulas`` (the closed forms in XLA ops, written once
for the norm family) and ``backend`` (the table entry)."""
