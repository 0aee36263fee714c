"""What a workspace shows: a value spelled there distinctively anchors no verdict (``tasks/visible.py``)."""

from __future__ import annotations

import decimal
import gzip
import io
import lzma
import pickle
import zipfile

import numpy
import pyarrow
import pyarrow.parquet
import pytest
from test_validate import _task_from

from trialforge.sandbox.base import Limits
from trialforge.store.objstore import open_store
from trialforge.tasks import visible
from trialforge.tasks.snapshots import SnapshotStore
from trialforge.tasks.validate import ValidateConfig, validate_task
from trialforge.tasks.visible import WorkspaceText


@pytest.mark.pure
def test_an_answer_is_a_distinctive_value_in_a_text_that_also_spells_one_of_the_tests_inputs(tmp_path) -> None:
    """Or in any text but module code when the test has no distinctive input of its own (its inputs come from a
    fixture or a file: the code's key is whatever it is given)."""
    (tmp_path / "tests" / "data").mkdir(parents=True)
    (tmp_path / "tests" / "data" / "scale.json").write_text("[\n  [3071, 4071],\n  [1200, 950.00]\n]\n")
    # a record spread over lines, its input no literal of any test: a data file answers whatever its layout
    (tmp_path / "tests" / "data" / "case7.out").write_text('{\n  "id": 7,\n\n\n\n  "total": 88120\n}\n')
    (tmp_path / "tests" / "test_legacy.py").write_text(
        '@skip\ndef test_old():\n    text = "Hello There"\n\n\n\n    assert slug(text) == "hello-there"\n'
    )
    (tmp_path / "tests" / "conftest.py").write_text('LEDGER = [("Salary", "3000.00"), ("Rent", "-1250.00")]\n')
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "objects").write_text("31337 beside 4242")
    shown = WorkspaceText.of(tmp_path)
    assert shown.answers(4071, [3071]) and shown.answers(950.0, [3071])  # a data file: whatever its layout
    assert shown.answers(4071, []) and shown.answers(88120, [7]) and shown.answers([4071, 88120], [])  # no key given
    assert not shown.answers(88120, [3071]) and not shown.answers(4071, [5555])  # the test's input is not beside it
    assert shown.answers("hello-there", ["Hello There"])  # a module: with an input, however far apart
    assert shown.answers(decimal.Decimal("3000.0"), ["Salary"])  # a number by its value, any spelling
    assert shown.answers(-1250, ["Rent"]) and not shown.answers(1250, ["Rent"])  # its sign is its own
    # a module spelling the value with none of the test's inputs holds what the code computes from them
    assert not shown.answers(3000, ["Income"]) and not shown.answers("hello-there", ["Goodbye"])
    assert not shown.answers(407, []) and not shown.answers(40710, [])  # digits inside another number
    assert not shown.answers(12, []) and not shown.answers("yes", [])  # too common to tell
    assert shown.answers("json", [])  # a file's path is readable too ("scale.json")
    assert not shown.answers([4071, 5555], [])  # a container is readable only as a whole
    assert not shown.answers(31337, [4242])  # .git is not the workspace


@pytest.mark.pure
def test_what_the_code_picks_out_of_its_own_inputs_is_no_stored_answer() -> None:
    """A bundled ticket's ``descendants("Assets:Bank") == ["Assets:Bank", "Assets:Bank:Checking"]``: every text that
    spells the input ``"Assets:Bank:Checking"`` spells ``"Assets:Bank"`` inside it; only a spelling of its own counts.
    An echo of the whole value is readable (returning the argument guesses it)."""
    inputs = ["Assets:Bank:Checking", "Assets:Banking:Fees", "Assets:Bank"]
    chart = WorkspaceText([], ['chart.add("assets:bank:checking"); chart.add("assets:banking:fees")'])  # as read
    assert not chart.answers(["Assets:Bank", "Assets:Bank:Checking"], inputs)
    assert WorkspaceText([], ["assets:bank:checking; the parent: assets:bank"]).answers("Assets:Bank", inputs[:2])
    assert chart.answers("Assets:Bank", inputs) and chart.answers("crème brûlée", ["crème brûlée"])  # echoes
    # the value in another case than its input is no echo, and a text spelling it answers
    assert WorkspaceText([], ["kundennr;name\n4711;bäckerei müller"]).answers("Bäckerei Müller", ["BÄCKEREI MÜLLER"])


@pytest.mark.pure
def test_values_stored_compressed_pickled_or_in_arrays_are_as_readable_as_text(tmp_path) -> None:
    """Code reads such a file one import away, so the host reads it too (a pickle by disassembly: none of it runs)."""
    data = tmp_path / "tests" / "data"
    data.mkdir(parents=True)
    (data / "snap.json.gz").write_bytes(gzip.compress(b'{"total": 88120}'))
    (data / "cases.pkl").write_bytes(pickle.dumps({"fold": [decimal.Decimal("9190.5"), "hello-there"]}))
    buffer = io.BytesIO()
    numpy.save(buffer, numpy.array([1.5, 4071.0]))
    (data / "want.npy").write_bytes(buffer.getvalue())
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("inner/a.txt.xz", lzma.compress(b"7654321"))
    (data / "bundle.zip").write_bytes(buffer.getvalue())
    buffer = io.BytesIO()
    pyarrow.parquet.write_table(pyarrow.table({"key": [3071], "want": [5150]}), buffer)
    (data / "table.parquet").write_bytes(buffer.getvalue())
    (data / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"31337" * 10)
    shown = WorkspaceText.of(tmp_path)
    assert all(shown.answers(v, []) for v in (88120, decimal.Decimal("9190.50"), "hello-there", 4071, 7654321, 5150))
    assert not shown.answers(31337, [])  # an image holds no answer
    assert not shown.cut and not WorkspaceText.of(tmp_path, leave_out=["tests/data/table.parquet"]).answers(5150, [])


@pytest.mark.pure
def test_a_tree_past_the_caps_counts_every_distinctive_value_as_readable(tmp_path, monkeypatch) -> None:
    """What the host did not read, code may: a dataset past the caps anchors nothing rather than everything."""
    monkeypatch.setattr(visible, "MAX_FILE_BYTES", 64)
    (tmp_path / "small.txt").write_text("1234")
    assert not WorkspaceText.of(tmp_path).answers(9999, [])
    (tmp_path / "big.csv").write_text("x,y\n" * 40)
    shown = WorkspaceText.of(tmp_path)
    assert shown.cut and shown.answers(9999, []) and not shown.answers(12, [])


@pytest.mark.sandbox
@pytest.mark.parametrize("data", [{}, {"tests/data/cases.json": "[[3071, 4071]]\n"}], ids=["none", "in-test-patch"])
def test_an_expected_value_a_test_patch_file_holds_anchors_nothing(tmp_path, bwrap_backend, base_image, data) -> None:
    """A mined task whose test patch brings a data file: it is in the graded sandbox, where the package can read
    4071 off it, so ``assert scale(3071) == 4071`` (judged on the host) anchors nothing and the gate would drop the
    task; without the file the same assertion anchors it."""
    snapshots = SnapshotStore(open_store(f"file://{tmp_path / 'store'}"), tmp_path / "cache")
    tests = "from calc import scale\n\n\ndef test_scale():\n    assert scale(3071) == 4071\n"
    fixed = {"calc.py": "def scale(n):\n    return n + 1000\n", "tests/test_scale.py": tests, **data}
    task = _task_from(tmp_path / "t", snapshots, {"calc.py": "def scale(n):\n    return n + 999\n"}, fixed)
    task = validate_task(task, bwrap_backend, base_image.name, snapshots, Limits(), ValidateConfig(runs=1))
    assert task.validation.valid, task.validation.reason
    record = task.validation.host_judged
    assert record.fail_to_pass_anchored == (0 if data else 1)
    assert list(record.unanchored.values()) == (["every expected value it has is readable in the workspace "
                                                 "(tasks/visible.py)"] if data else [])  # fmt: skip
