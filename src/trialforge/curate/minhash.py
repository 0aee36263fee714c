"""MinHash signatures and banded LSH, vectorised over whole batches of documents.

A document is a set of 64-bit shingle hashes; its signature holds, for each of ``num_perm`` hash functions
``h_i(x) = (a_i * x + b_i) mod p`` with ``p = 2**31 - 1``, the minimum over its shingles, computed exactly in uint64
and stored as uint32. Why that prime, and where the speed comes from: docs/pipeline.md, "Decontamination".
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import numpy as np

from trialforge.curate.ngrams import expand_ranges, mix64

MERSENNE_31 = (1 << 31) - 1
EMPTY = np.uint32(0xFFFFFFFF)  # above every hash value: the signature of a shingle-less document
_P = np.uint64(MERSENNE_31)
_SHIFT = np.uint64(31)
_CHUNK = 512  # distinct shingles per hashing pass: two (512, 128) uint64 buffers, 1 MiB, reused
_GATHER = 2048  # shingles per minimum pass: a (2048, 128) uint32 block, 1 MiB
_BATCH = 1 << 16  # shingles sharing one table of distinct shingles: at most 32 MiB of uint32
_POLY = np.uint64(0x9E3779B97F4A7C15)
_BAND_SALT = np.uint64(0xD6E8FEB86659FD93)


class MinHasher:
    """``num_perm`` universal hash functions drawn from ``seed``; same seed, same signatures.

    Holds scratch buffers it reuses across calls (fresh pages would fault on every batch),
    so one instance serves one thread.
    """

    def __init__(self, num_perm: int = 128, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.num_perm = num_perm
        self._a = rng.integers(1, MERSENNE_31, size=num_perm, dtype=np.uint64)
        self._b = rng.integers(0, MERSENNE_31, size=num_perm, dtype=np.uint64)
        self._buf = np.empty((_CHUNK, num_perm), dtype=np.uint64)
        self._tmp = np.empty_like(self._buf)
        self._gathered = np.empty(_GATHER * num_perm, dtype=np.uint32)

    def signatures(self, shingles: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Signatures ``(len(counts), num_perm)`` uint32 of documents given back to back.

        ``shingles`` holds every document's shingle hashes in turn, ``counts`` how many each
        has. A document without shingles gets the all-``EMPTY`` signature, which the LSH
        index never stores or matches.

        Each distinct shingle of the batch is hashed once into a ``(distinct, num_perm)``
        table; a document's signature is then the minimum over its rows of that table.
        Code repeats itself (a third of the shingles of a batch are distinct in the
        benchmark), so this does a fraction of the modular arithmetic, and the per-document
        pass works on uint32 rows instead of uint64.
        """
        counts = np.asarray(counts, dtype=np.int64)
        out = np.full((len(counts), self.num_perm), EMPTY, dtype=np.uint32)
        bounds = np.concatenate(([0], np.cumsum(counts)))
        for block, lo, hi in _doc_blocks(bounds, _BATCH):  # bounds the table's memory
            first, last = int(block[0]), int(block[-1]) + 1
            out[first:last] = self._batch_signatures(shingles[lo:hi], bounds[first : last + 1] - lo)
        return out

    def _batch_signatures(self, shingles: np.ndarray, bounds: np.ndarray) -> np.ndarray:
        """Signatures of consecutive documents whose shingles start at ``bounds[:-1]``.

        Documents are taken in order of length, a group of similar lengths at a time, and
        their row indices padded to the longest with a row of ``EMPTY``: one gather and one
        ``min(axis=1)`` per group instead of numpy calls per document (``np.minimum.reduceat``
        along rows is five times slower than ``min``).
        """
        counts = np.diff(bounds)
        out = np.full((len(counts), self.num_perm), EMPTY, dtype=np.uint32)
        distinct, inverse = np.unique(shingles, return_inverse=True)
        table = self._table(distinct % _P)  # its last row is the EMPTY padding
        order = np.argsort(counts, kind="stable")
        order = order[counts[order] > 0]
        lengths = counts[order]
        i = 0
        while i < len(order):
            if lengths[i] > _GATHER:  # the longest documents, one at a time: a running minimum
                doc, lo = int(order[i]), int(bounds[order[i]])
                for start in range(lo, lo + int(lengths[i]), _GATHER):
                    rows = table[inverse[start : min(start + _GATHER, lo + int(lengths[i]))]]
                    np.minimum(out[doc], rows.min(axis=0), out=out[doc])
                i += 1
                continue
            size = np.arange(1, min(len(order) - i, _GATHER) + 1)
            j = i + int(np.count_nonzero(size * lengths[i : i + len(size)] <= _GATHER))
            docs, width = order[i:j], int(lengths[j - 1])
            columns = np.arange(width)
            positions = np.minimum(bounds[docs][:, None] + columns, len(inverse) - 1)
            rows = np.where(columns < counts[docs][:, None], inverse[positions], len(distinct))
            gathered = self._gathered[: rows.size * self.num_perm].reshape(*rows.shape, self.num_perm)
            out[docs] = np.take(table, rows, axis=0, out=gathered).min(axis=1)
            i = j
        return out

    def _table(self, x: np.ndarray) -> np.ndarray:
        """``(a * x + b) mod p`` for every shingle (rows) and function (columns), as uint32,
        and a last row of ``EMPTY``.

        With ``a, x, b < p`` the sum ``v`` is below ``2**62 - 2**31``, so one Mersenne fold
        ``(v & p) + (v >> 31)`` lands in ``[0, 2p)`` and ``min(f, f - p)`` (the subtraction
        wraps when ``f < p``) finishes the reduction: exact, and cheaper than
        ``np.remainder``, which divides element by element.
        """
        table = np.empty((len(x) + 1, self.num_perm), dtype=np.uint32)
        table[-1] = EMPTY
        for start in range(0, len(x), _CHUNK):
            part = x[start : start + _CHUNK, None]
            v, tmp = self._buf[: len(part)], self._tmp[: len(part)]
            np.multiply(part, self._a, out=v)
            v += self._b
            np.right_shift(v, _SHIFT, out=tmp)
            v &= _P
            v += tmp
            np.subtract(v, _P, out=tmp)
            np.minimum(v, tmp, out=v)
            table[start : start + len(part)] = v
        return table


def _doc_blocks(bounds: np.ndarray, limit: int) -> Iterator[tuple[np.ndarray, int, int]]:
    """Runs of consecutive non-empty documents with at most ``limit`` shingles in all
    (or a single larger document): ``(document indices, first shingle, end shingle)``."""
    docs = np.flatnonzero(np.diff(bounds))
    i = 0
    while i < len(docs):
        lo = int(bounds[docs[i]])
        end = max(int(np.searchsorted(bounds, lo + limit, side="right")) - 1, int(docs[i]) + 1)
        j = int(np.searchsorted(docs, end))
        yield docs[i:j], lo, int(bounds[end])
        i = j


@functools.lru_cache(maxsize=64)
def lsh_params(threshold: float, num_perm: int, fp_weight: float = 0.1, fn_weight: float = 0.9) -> tuple[int, int]:
    """Bands ``b`` and rows ``r`` (``b * r <= num_perm``) for a Jaccard ``threshold``.

    Two documents with Jaccard ``s`` share at least one band with probability
    ``1 - (1 - s**r)**b``. Like datasketch, this minimises the weighted area of false
    positives (below the threshold) plus false negatives (above it). The default weights
    favour recall: every candidate is verified against the full signature afterwards, so a
    false candidate costs one comparison while a missed one is a leak nobody sees.
    For 0.7 and 128 permutations this gives 20 bands of 6 rows: candidate probability
    0.92 at s = 0.7 and 0.996 at s = 0.8, at the price of 0.27 at s = 0.5.
    """
    pairs = np.array([(b, r) for b in range(1, num_perm + 1) for r in range(1, num_perm // b + 1)], dtype=np.float64)
    bands, rows = pairs[:, :1], pairs[:, 1:]
    below = np.linspace(0.0, threshold, 257)
    above = np.linspace(threshold, 1.0, 257)
    fp = np.trapezoid(1 - (1 - below**rows) ** bands, below, axis=1)
    fn = np.trapezoid((1 - above**rows) ** bands, above, axis=1)
    best = int(np.argmin(fp_weight * fp + fn_weight * fn))
    return int(pairs[best, 0]), int(pairs[best, 1])


def band_keys(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """One 64-bit key per band: ``(n, bands)``; keys of different bands never collide by design."""
    n = len(signatures)
    block = signatures[:, : bands * rows].reshape(n, bands, rows).astype(np.uint64)
    acc = block[:, :, 0].copy()
    for j in range(1, rows):
        acc *= _POLY
        acc += block[:, :, j]
    acc += np.arange(bands, dtype=np.uint64) * _BAND_SALT
    return mix64(acc)


class LSHIndex:
    """Banded LSH over reference signatures, queried a batch at a time."""

    def __init__(self, signatures: np.ndarray, bands: int, rows: int) -> None:
        if bands * rows > signatures.shape[1]:
            raise ValueError(
                f"{bands} bands x {rows} rows need {bands * rows} permutations, signatures have {signatures.shape[1]}"
            )
        self.bands, self.rows = bands, rows
        self.signatures = signatures
        valid = np.flatnonzero(signatures[:, 0] != EMPTY)
        keys = band_keys(signatures[valid], bands, rows).ravel()
        order = np.argsort(keys, kind="stable")
        self.keys: np.ndarray = keys[order]
        self.docs: np.ndarray = np.repeat(valid.astype(np.int32), bands)[order]

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.docs.nbytes + self.signatures.nbytes)

    def candidates(self, signatures: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Distinct (query, reference) pairs that share at least one band."""
        valid = np.flatnonzero(signatures[:, 0] != EMPTY)
        keys = band_keys(signatures[valid], self.bands, self.rows).ravel()
        left = np.searchsorted(self.keys, keys, side="left")
        counts = np.searchsorted(self.keys, keys, side="right") - left
        hit = np.flatnonzero(counts)
        if len(hit) == 0:
            return np.empty(0, np.int64), np.empty(0, np.int64)
        queries = np.repeat(valid[hit // self.bands], counts[hit])
        refs = self.docs[expand_ranges(left[hit], counts[hit])]
        pairs = np.unique(queries.astype(np.int64) * len(self.signatures) + refs)
        return pairs // len(self.signatures), pairs % len(self.signatures)

    def query(self, signatures: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Candidate pairs whose estimated Jaccard (agreeing positions / num_perm) >= threshold."""
        queries, refs = self.candidates(signatures)
        scores = np.empty(len(queries), dtype=np.float64)
        for start in range(0, len(queries), 65536):  # bounded memory for boilerplate-heavy batches
            part = slice(start, start + 65536)
            scores[part] = (signatures[queries[part]] == self.signatures[refs[part]]).mean(axis=1)
        keep = scores >= threshold
        return queries[keep], refs[keep], scores[keep]
