"""Byte-level language-modelling data: a default corpus that exists on every machine.

The default corpus is the Python standard library's own source: every ``*.py`` file of a fixed
list of top-level packages (their ``test`` sub-packages excluded), in sorted path order. Every
tenth file (by that order) goes to the validation split, the rest to training, so the split
never cuts a file in half. The corpus records its file list, size and SHA-256, so a result can
be tied to the exact bytes it was trained on (the bytes differ between Python versions).

``load_corpus(path)`` instead reads any UTF-8 text file and keeps its last 10% for validation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import sys
import sysconfig
from typing import Iterator

import numpy as np

__all__ = ["DEFAULT_PACKAGES", "SUBSET_CHUNK", "Corpus", "batches", "batch_at", "load_corpus", "train_subset",
           "unigram_cross_entropy_nats", "unigram_entropy_nats"]

# Top-level stdlib packages of the default corpus (fixed list; ~2 MB of Python source).
DEFAULT_PACKAGES = ("asyncio", "collections", "concurrent", "email", "http", "importlib",
                    "json", "logging", "unittest", "urllib", "xml")
VALID_EVERY = 10      # default corpus: every 10th file is validation
VALID_FRACTION = 0.1  # --data file: the last 10% of its bytes are validation
SEPARATOR = b"\n\n"   # between files
SUBSET_CHUNK = 512    # train_subset: the training split is cut into chunks of this many bytes
SUBSET_SEED = 31_337  # train_subset: the fixed order of the chunks (the same for every run)


@dataclasses.dataclass(frozen=True, eq=False)
class Corpus:
  """A byte-level corpus split into training and validation bytes.

  Attributes:
    train: training bytes, ``np.uint8`` of shape ``(n_train,)``.
    valid: validation bytes, ``np.uint8`` of shape ``(n_valid,)``.
    name: ``"stdlib-<python version>"`` or the file name.
    sha256: hex SHA-256 of all bytes (train files then valid files for the default corpus).
    n_bytes: ``len(train) + len(valid)``.
    files: paths of the source files, relative to the stdlib root (or the one data file).
  """

  train: np.ndarray
  valid: np.ndarray
  name: str
  sha256: str
  n_bytes: int
  files: list[str]

  def describe(self) -> dict:
    """A JSON-serializable summary (no data), for run records."""
    return {"name": self.name, "sha256": self.sha256, "n_bytes": self.n_bytes,
            "n_train": int(self.train.size), "n_valid": int(self.valid.size),
            "n_files": len(self.files)}


def _stdlib_files() -> tuple[pathlib.Path, list[pathlib.Path]]:
  root = pathlib.Path(sysconfig.get_paths()["stdlib"])
  files = []
  for package in DEFAULT_PACKAGES:
    for f in (root / package).rglob("*.py"):
      rel = f.relative_to(root)
      if any(part in ("test", "tests") for part in rel.parts[:-1]):
        continue
      files.append(f)
  files.sort(key=lambda f: f.relative_to(root).as_posix())
  if not files:
    raise FileNotFoundError(
        f"no Python sources of {DEFAULT_PACKAGES} found under the standard library at {root}; "
        f"pass a text file with --data PATH instead.")
  return root, files


def load_corpus(path: str | pathlib.Path | None = None) -> Corpus:
  """Loads the default stdlib corpus (``path=None``) or a UTF-8 text file.

  Args:
    path: ``None`` for the default corpus, else a UTF-8 text file of at least a few bytes.

  Returns:
    A :class:`Corpus`.

  Raises:
    FileNotFoundError: ``path`` does not exist or is not a file.
    ValueError: ``path`` is not valid UTF-8 or is too small to split.
  """
  if path is None:
    root, files = _stdlib_files()
    train_parts, valid_parts = [], []
    for i, f in enumerate(files):
      (valid_parts if i % VALID_EVERY == VALID_EVERY - 1 else train_parts).append(f.read_bytes())
    train = SEPARATOR.join(train_parts)
    valid = SEPARATOR.join(valid_parts)
    name = f"stdlib-{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    rel = [f.relative_to(root).as_posix() for f in files]
  else:
    p = pathlib.Path(path)
    if not p.is_file():
      raise FileNotFoundError(f"data file {str(path)!r} does not exist or is not a file; "
                              f"pass an existing UTF-8 text file (or omit it for the default).")
    raw = p.read_bytes()
    try:
      raw.decode("utf-8")
    except UnicodeDecodeError as e:
      raise ValueError(f"data file {str(path)!r} is not valid UTF-8 text ({e}).") from None
    if len(raw) < 20:
      raise ValueError(f"data file {str(path)!r} has {len(raw)} bytes; need at least 20 to "
                       f"split into training and validation.")
    cut = len(raw) - max(1, int(len(raw) * VALID_FRACTION))
    train, valid = raw[:cut], raw[cut:]
    name, rel = p.name, [p.name]
  digest = hashlib.sha256(train + valid).hexdigest()
  return Corpus(train=np.frombuffer(train, np.uint8), valid=np.frombuffer(valid, np.uint8),
                name=name, sha256=digest, n_bytes=len(train) + len(valid), files=rel)


def train_subset(train: np.ndarray, n_bytes: int | None) -> np.ndarray:
  """The first ``n_bytes`` unique training bytes: nested subsets of the training split.

  The split is cut into chunks of :data:`SUBSET_CHUNK` bytes, the chunks are put in one fixed random
  order (seed :data:`SUBSET_SEED`, the same for every run and size) and the first
  ``ceil(n_bytes / SUBSET_CHUNK)`` chunks of that order, joined, are cut to ``n_bytes``. A smaller
  subset is therefore a prefix of every larger one (as WikiText-103's first 1M/10M tokens in Verma 2026),
  and every size samples the whole corpus rather than its first files (the stdlib corpus is sorted by
  package, so a prefix of the split would be one package). ``None`` (or at least the split's size):
  the whole split, unchanged.

  Raises:
    ValueError: ``n_bytes`` is below ``2 * SUBSET_CHUNK`` (too few chunks to sample windows from).
  """
  if n_bytes is None or n_bytes >= train.size:
    return train
  if n_bytes < 2 * SUBSET_CHUNK:
    raise ValueError(f"n_bytes must be at least {2 * SUBSET_CHUNK} (two chunks of {SUBSET_CHUNK} bytes), "
                     f"got {n_bytes}.")
  n_chunks = train.size // SUBSET_CHUNK
  order = np.random.default_rng(SUBSET_SEED).permutation(n_chunks)
  take = order[:-(-n_bytes // SUBSET_CHUNK)]
  return np.concatenate([train[i * SUBSET_CHUNK:(i + 1) * SUBSET_CHUNK] for i in take])[:n_bytes]


def batch_at(data: np.ndarray, index: int, *, batch_size: int, seq_len: int,
             seed: int) -> tuple[np.ndarray, np.ndarray]:
  """The ``index``-th batch of the stream ``batches(data, ..., seed=seed)``.

  Each batch depends only on ``(seed, index)``, so a resumed run continues the same stream.

  Returns:
    ``(inputs, targets)``, both int32 ``(batch_size, seq_len)``, targets shifted by one byte.
  """
  if data.ndim != 1 or data.size < seq_len + 2:
    raise ValueError(f"data must be a 1-D byte array longer than seq_len + 1 = {seq_len + 1}, "
                     f"got shape {data.shape}; use a larger corpus or a smaller seq_len.")
  rng = np.random.default_rng([seed, index])
  starts = rng.integers(0, data.size - seq_len - 1, size=batch_size)
  windows = np.stack([data[s:s + seq_len + 1] for s in starts]).astype(np.int32)
  return windows[:, :-1], windows[:, 1:]


def batches(data: np.ndarray, *, batch_size: int, seq_len: int, seed: int,
            start: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """An endless, reproducible stream of random windows of ``data``.

  Args:
    data: 1-D ``np.uint8`` bytes.
    batch_size: sequences per batch.
    seq_len: tokens per sequence.
    seed: the stream's seed; the same seed gives the same batches.
    start: index of the first batch (to resume a stream).

  Yields:
    ``(inputs, targets)`` int32 arrays of shape ``(batch_size, seq_len)``.
  """
  for name, value in (("batch_size", batch_size), ("seq_len", seq_len)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f"{name} must be a positive int, got {value!r}.")
  index = start
  while True:
    yield batch_at(data, index, batch_size=batch_size, seq_len=seq_len, seed=seed)
    index += 1


def unigram_entropy_nats(corpus: Corpus) -> float:
  r"""Entropy of the training split's byte distribution, in nats: the unigram baseline loss.

  .. math::

     H = -\sum_b p_b \log p_b, \qquad p_b = \frac{\#\{i : \text{train}_i = b\}}{n_\text{train}}

  A model that ignores context cannot beat this loss on data from the same distribution.
  """
  counts = np.bincount(corpus.train, minlength=256).astype(np.float64)
  p = counts[counts > 0] / counts.sum()
  return float(-(p * np.log(p)).sum())


def unigram_cross_entropy_nats(corpus: Corpus, targets: np.ndarray) -> float:
  r"""Mean loss on ``targets`` of the model that predicts every byte from the training split's byte
  frequencies: the plateau a model that ignores context sits on, measured on these very bytes.

  .. math::

     \bar H = -\frac{1}{n} \sum_{i=1}^{n} \log p_{t_i}

  with :math:`p` as in :func:`unigram_entropy_nats`. On a small evaluation sample it differs from
  the entropy :math:`H` by the sample's own byte mix (four 16 x 32 batches of the default corpus:
  2.956 nats against :math:`H` = 3.102), so a rule that asks whether a validation loss is still
  on the unigram plateau compares it with this number, not with :math:`H`.

  Raises:
    ValueError: ``targets`` is empty, or holds a byte the training split never contains.
  """
  t = np.asarray(targets).ravel()
  if t.size == 0:
    raise ValueError("targets must hold at least one byte, got an empty array.")
  counts = np.bincount(corpus.train, minlength=256).astype(np.float64)
  p = counts / counts.sum()
  if np.any(p[t] == 0):
    raise ValueError("targets hold a byte that the training split never contains: its unigram loss is "
                     "infinite; use a corpus whose training split covers the validation bytes.")
  return float(-np.mean(np.log(p[t])))
