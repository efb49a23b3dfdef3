"""The one progress helper of the harness and the suite: a tqdm bar, plain lines, or nothing.

A training run (:func:`experiments.harness.train.train`), an experiment's loops
(:meth:`experiments.suite.context.Context.iterate`) and the suite's list of experiments
(:func:`experiments.suite.runner.run_suite`) all report progress through :class:`Progress`: a
tqdm bar where a terminal shows it, else plain lines handed to a ``log`` function (every
``every``-th step and the last), else nothing.
"""

from __future__ import annotations

import sys
from typing import Callable, Iterable, Iterator

__all__ = ["Progress", "iterate", "stderr_line"]


def stderr_line(text: str) -> None:
  """Prints ``text`` as one flushed line on stderr (the plain-line ``log`` of a training run)."""
  print(text, file=sys.stderr, flush=True)


class Progress:
  """A progress display over ``total`` steps.

  Args:
    total: the number of steps.
    desc: the bar's label and the plain line's prefix.
    bar: draw a tqdm bar (on stderr).
    log: without a bar, where plain lines go (None: no lines).
    every: without a bar, one line every this many steps (and at the last).
    initial: steps already done (a resumed run).
    unit: the bar's unit.
    leave: keep the bar on screen when closed.
  """

  def __init__(self, total: int, *, desc: str, bar: bool, log: Callable[[str], None] | None = None,
               every: int = 1, initial: int = 0, unit: str = "it", leave: bool = True):
    if isinstance(total, bool) or not isinstance(total, int) or total < 0:
      raise ValueError(f"total must be an int >= 0, got {total!r}.")
    self.total, self.desc, self.log, self.every = total, desc, log, max(1, int(every))
    self.bar = None
    if bar:
      from tqdm.auto import tqdm
      self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                      leave=leave)

  def update(self, done: int, text: str | None = None, postfix: dict | None = None) -> None:
    """Marks step ``done`` finished: advances the bar (with ``postfix``), or logs ``text``
    (default ``"<desc> <done>/<total>"``) on every ``every``-th step and the last."""
    if self.bar is not None:
      if postfix:
        self.bar.set_postfix(postfix, refresh=False)
      self.bar.update(1)
    elif self.log is not None and (done % self.every == 0 or done == self.total):
      self.log(text if text is not None else f"{self.desc} {done}/{self.total}")

  def message(self, text: str) -> None:
    """A line of text that does not break the bar (or a plain line; nothing without ``log``)."""
    if self.bar is not None:
      self.bar.write(text, file=sys.stderr)
    elif self.log is not None:
      self.log(text)

  def close(self) -> None:
    """Closes the bar, if any."""
    if self.bar is not None:
      self.bar.close()


def iterate(items: Iterable, *, desc: str, bar: bool, log: Callable[[str], None] | None,
            total: int | None = None) -> Iterator:
  """Yields ``items`` with a transient bar, or with one plain line ``"<desc> i/n"`` before each item."""
  items = list(items)
  p = Progress(len(items) if total is None else total, desc=desc, bar=bar, log=None, leave=False)
  try:
    for i, item in enumerate(items):
      if p.bar is None and log is not None:
        log(f"{desc} {i + 1}/{p.total}")
      yield item
      p.update(i + 1)
  finally:
    p.close()
