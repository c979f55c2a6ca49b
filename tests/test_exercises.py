"""exercises/ and solutions/: one source, in sync, every exercise checked, stubs that never break a notebook."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
# The generator is a maintainer's script in tools/, not part of the package: load it from its file.
_spec = importlib.util.spec_from_file_location("make_exercises", ROOT / "tools" / "make_exercises.py")
make_exercises = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_exercises)
exercise_from, stub_code = make_exercises.exercise_from, make_exercises.stub_code

SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def check_cells(path: Path) -> list[dict]:
    return [c for c in cells(path) if c["cell_type"] == "code" and "checks.check_" in "".join(c["source"])]


def shown(cell: dict) -> str:
    return "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                   for o in cell["outputs"])


def test_every_lesson_notebook_has_exercises_and_solutions():
    assert [p.name for p in SOLUTIONS] == [p.name for p in LESSONS]
    assert [p.name for p in sorted((ROOT / "exercises").glob("*.ipynb"))] == [p.name for p in LESSONS]


def test_exercises_are_in_sync_with_solutions():
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "make_exercises.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_each_solution_notebook_has_at_least_two_checked_exercises_all_correct(path: Path):
    checked = check_cells(path)
    assert len(checked) >= 2
    for cell in checked:
        assert shown(cell).startswith("Correct: "), f"a worked answer does not pass its check: {shown(cell)}"


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.name)
def test_each_exercise_check_says_not_done_yet_and_every_answer_region_is_followed_by_a_check(path: Path):
    exercise = ROOT / "exercises" / path.name
    for cell in check_cells(exercise):
        assert shown(cell).startswith("Not done yet: "), shown(cell)
    source_cells = cells(path)
    for i, cell in enumerate(source_cells):
        if "### BEGIN SOLUTION" in "".join(cell["source"]):
            following = [c for c in source_cells[i + 1:] if c["cell_type"] == "code"][:1]
            assert following and "checks.check_" in "".join(following[0]["source"]), (
                f"cell {i} holds an answer but the next code cell is not a check")


def test_the_original_five_practice_exercises_are_all_there():
    text = "\n".join(p.read_text(encoding="utf-8") for p in SOLUTIONS)
    for needle in ("check_add_postprocess", "check_run_graph_with_levels", "check_window_tradeoff",
                   "check_find_cycle_nodes", "check_triton_ensemble", "from the original practice set"):
        assert needle in text
    assert text.count("from the original practice set") == 5


def test_stub_keeps_indentation_and_hint_and_drops_the_answer():
    source = "def f(x):\n    ### BEGIN SOLUTION (add one)\n    return x + 1\n    ### END SOLUTION\n"
    assert stub_code(source, "t") == "def f(x):\n    raise NotImplementedError('add one')"


@pytest.mark.parametrize(
    ("source", "message"),
    [("### BEGIN SOLUTION\nx = 1\n", "never closed"), ("### END SOLUTION\n", "END SOLUTION without a BEGIN"),
     ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n", "inside another")],
)
def test_malformed_markers_are_reported_with_their_place(source, message):
    with pytest.raises(ValueError, match=message):
        stub_code(source, "solutions/x.ipynb, cell 3")


def test_written_answers_become_empty_answer_cells():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# T\n\n> **Solutions copy.** here"),
                nbformat.v4.new_markdown_cell("**Answer.** secret")]
    nb.cells[1].metadata["tags"] = ["answer"]
    exercise = exercise_from(nb, "99_x.ipynb")
    assert "secret" not in exercise.cells[1].source and "Your answer" in exercise.cells[1].source
    assert "tags" not in exercise.cells[1].metadata
    assert "**Exercises copy.**" in exercise.cells[0].source and "solutions/99_x.ipynb" in exercise.cells[0].source
