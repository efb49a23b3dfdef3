"""An experiment's outputs: progress lines, JSON/CSV files and figures in its folder."""

from __future__ import annotations

import datetime
import pathlib
from typing import Any, Iterable, Iterator

import numpy as np

from experiments.suite.registry import write_json

__all__ = ["OutputsMixin"]


class OutputsMixin:
  """Logging, progress and files of :class:`~experiments.suite.context.Context` (``exp_dir``,
  ``exp_name``, ``progress``, ``preset`` and ``_log`` are set by its ``__init__``)."""

  def log(self, msg: str) -> None:
    """Prints one progress line, prefixed with the time and the experiment's name."""
    stamp = datetime.datetime.now().strftime("%H:%M:%S")
    self._log(f"[{stamp}] {self.exp_name or 'suite'}: {msg}")

  def iterate(self, items: Iterable, *, desc: str, total: int | None = None) -> Iterator:
    """Iterates over ``items`` with a tqdm bar on a TTY, or with one plain line per item."""
    from experiments.harness import progress as progress_lib
    if self.progress:
      yield from progress_lib.iterate(items, desc=f"{self.exp_name}: {desc}", bar=True, log=None, total=total)
    else:
      yield from progress_lib.iterate(items, desc=desc, bar=False, log=self.log, total=total)

  def save_json(self, name: str, obj: Any) -> pathlib.Path:
    """Writes ``obj`` as JSON (:func:`write_json`) to ``exp_dir / name``; returns the path."""
    path = self.exp_dir / name
    write_json(path, obj)
    return path

  def save_csv(self, name: str, header: list[str], rows: Iterable[Iterable[Any]]) -> pathlib.Path:
    """Writes a CSV file (floats with 6 significant digits)."""
    path = self.exp_dir / name
    lines = [",".join(header)]
    for row in rows:
      lines.append(",".join(_csv_cell(v) for v in row))
    path.write_text("\n".join(lines) + "\n")
    return path

  def subplots(self, *args, **kwargs):
    """``matplotlib.pyplot.subplots(*args, **kwargs)`` on the file-only Agg backend.

    Every experiment's ``plot`` starts here and ends with :meth:`save_figure`.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt.subplots(*args, **kwargs)

  def save_figure(self, fig, name: str) -> str:
    """Saves a matplotlib figure as a PNG (modest dpi) and closes it; returns the file name."""
    import matplotlib.pyplot as plt
    path = self.exp_dir / name
    fig.tight_layout()
    fig.savefig(path, dpi=self.preset.get("dpi", 90), bbox_inches="tight")
    plt.close(fig)
    return name


def _csv_cell(v: Any) -> str:
  if isinstance(v, (float, np.floating)):
    return f"{float(v):z.6g}"
  return str(v)
