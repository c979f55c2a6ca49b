"""Notebook hygiene: what nbval cannot see, but a learner opening a notebook would."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p for d in ("notebooks", "exercises", "solutions") for p in (ROOT / d).glob("*.ipynb"))
ALLOWED_TAGS = {"raises-exception", "nbval-ignore-output"}
ANSWER_TAG = "answer"  # marks a written answer in solutions/, which tools/make_exercises.py empties


def code_cells(path: Path) -> list[dict]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [c for c in cells if c["cell_type"] == "code" and "".join(c["source"]).strip()]


def test_there_are_notebooks_to_check():
    assert len([p for p in NOTEBOOKS if p.parent.name == "notebooks"]) >= 3


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_notebook_is_saved_from_one_clean_run(path: Path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    cells = code_cells(path)
    assert [c["execution_count"] for c in cells] == list(range(1, len(cells) + 1)), (
        "execution counts are not 1..n: re-run it top to bottom in a fresh kernel (make notebooks)"
    )
    assert any(c["outputs"] for c in cells), "no stored outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_errors_only_where_tagged_and_only_known_tags(path: Path):
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    for cell in cells:
        if ANSWER_TAG in cell.get("metadata", {}).get("tags", []):
            assert path.parent.name == "solutions" and cell["cell_type"] == "markdown", (
                "the answer tag marks written answers in solutions/ only")
    for cell in code_cells(path):
        tags = set(cell.get("metadata", {}).get("tags", []))
        assert tags <= ALLOWED_TAGS, f"unexpected tags {tags - ALLOWED_TAGS} in cell {cell['execution_count']}"
        errors = [o for o in cell["outputs"] if o["output_type"] == "error"]
        if "raises-exception" in tags:
            assert errors, f"cell {cell['execution_count']} is tagged raises-exception but did not raise"
        else:
            assert not errors, f"cell {cell['execution_count']} raised {errors[0]['ename']} untagged"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_absolute_paths_or_path_hacks(path: Path):
    text = path.read_text(encoding="utf-8")
    for pattern in (r"/home/\w+", r"/Users/\w+", r"/root/", r"/work/", r"/tmp/", r"[A-Z]:\\\\Users"):
        assert not re.search(pattern, text), f"absolute path matching {pattern!r}"
    assert "sys.path" not in text, "notebooks import the installed package, never through sys.path"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_first_cell_has_a_title_and_navigation(path: Path):
    first = json.loads(path.read_text(encoding="utf-8"))["cells"][0]
    source = "".join(first["source"])
    assert first["cell_type"] == "markdown" and source.startswith("# "), "first cell should be the title"
    assert "What you'll learn" in source and "Contents" in source
    for link in re.findall(r"\]\(([^)#]+\.ipynb)\)", source):
        assert (path.parent / link).exists(), f"navigation link to missing notebook {link}"


def test_readme_lists_every_lesson_notebook():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for path in NOTEBOOKS:
        if path.parent.name == "notebooks":
            assert f"notebooks/{path.name}" in readme, f"README's notebook table is missing {path.name}"


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.parent.name in ("exercises", "solutions")],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_solutions_and_exercises_cannot_be_mistaken_for_each_other(path: Path):
    first = "".join(json.loads(path.read_text(encoding="utf-8"))["cells"][0]["source"])
    title = "# Solutions · " if path.parent.name == "solutions" else "# Exercises · "
    assert first.startswith(title), f"the first line should start with {title!r}, not {first.splitlines()[0]!r}"
