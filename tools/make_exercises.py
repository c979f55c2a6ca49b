"""Generate exercises/ from solutions/: answers become stubs, then each notebook is run and saved.

In a solution notebook:
- code between ``### BEGIN SOLUTION (hint text)`` and ``### END SOLUTION`` becomes
  ``raise NotImplementedError("hint text")`` at the same indentation (keep answers inside function
  bodies, so defining the function still works and the check cell can say "not done yet");
- a markdown cell tagged ``answer`` (a written answer) becomes an empty answer cell;
- the line starting ``> **Solutions copy.**`` in the first cell becomes the exercises' version, and a
  title starting ``# Solutions ·`` becomes ``# Exercises ·``.

    python tools/make_exercises.py           # every notebook in solutions/
    python tools/make_exercises.py --check   # exit 1 if exercises/ is out of date (what the test runs)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS, EXERCISES = ROOT / "solutions", ROOT / "exercises"
BEGIN = re.compile(r"^(?P<indent>\s*)### BEGIN SOLUTION(?:\s*\((?P<hint>.*)\))?\s*$")
END = re.compile(r"^\s*### END SOLUTION\s*$")
EMPTY_ANSWER = "**Your answer:**\n\n*(double-click to write here)*"


def stub_code(source: str, where: str) -> str:
    """Replace every answer region in a code cell's source with a NotImplementedError stub."""
    out, inside = [], False
    for number, line in enumerate(source.splitlines(), 1):
        begin = BEGIN.match(line)
        if begin:
            if inside:
                raise ValueError(f"{where}, line {number}: BEGIN SOLUTION inside another answer region")
            inside = True
            hint = begin.group("hint") or "write your answer here"
            out.append(f"{begin.group('indent')}raise NotImplementedError({hint!r})")
        elif END.match(line):
            if not inside:
                raise ValueError(f"{where}, line {number}: END SOLUTION without a BEGIN")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{where}: BEGIN SOLUTION is never closed")
    return "\n".join(out)


def exercise_from(solution: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """The exercise version of a solution notebook, outputs cleared (not yet run)."""
    nb = nbformat.v4.new_notebook(metadata=solution.metadata)
    for index, cell in enumerate(solution.cells):
        tags = list(cell.get("metadata", {}).get("tags", []))
        if cell.cell_type == "code":
            new = nbformat.v4.new_code_cell(stub_code(cell.source, f"{name}, cell {index}"))
        elif "answer" in tags:
            new = nbformat.v4.new_markdown_cell(EMPTY_ANSWER)
            tags.remove("answer")
        else:
            source = cell.source
            if index == 0:
                banner = (f"> **Exercises copy.** Stuck? Worked answers: [solutions/{name}](../solutions/{name}). "
                          f"To start over: `git checkout exercises/{name}`.")
                source = re.sub(r"^> \*\*Solutions copy\.\*\*.*$", banner, source, flags=re.M)
                source = re.sub(r"^# Solutions · ", "# Exercises · ", source, flags=re.M)
            new = nbformat.v4.new_markdown_cell(source)
        if tags:
            new.metadata["tags"] = tags
        new.id = cell.get("id", new.id)  # stable ids keep diffs and the sync test quiet
        nb.cells.append(new)
    return nb


def same_sources(a: nbformat.NotebookNode, b: nbformat.NotebookNode) -> bool:
    def shape(nb: nbformat.NotebookNode) -> list[tuple]:
        return [(c.cell_type, c.source, tuple(c.get("metadata", {}).get("tags", []))) for c in nb.cells]

    return shape(a) == shape(b)


def main(args: list[str]) -> int:
    check = "--check" in args
    stale = []
    for solution_path in sorted(SOLUTIONS.glob("*.ipynb")):
        exercise = exercise_from(nbformat.read(solution_path, as_version=4), solution_path.name)
        target = EXERCISES / solution_path.name
        if target.exists() and same_sources(exercise, nbformat.read(target, as_version=4)):
            continue
        stale.append(target)
        if not check:
            from execute_notebooks import execute  # a sibling script in tools/

            EXERCISES.mkdir(exist_ok=True)
            nbformat.write(exercise, target)
            print(f"{target.relative_to(ROOT)}: written and run in {execute(target):.1f} s", flush=True)
    known = {p.name for p in SOLUTIONS.glob("*.ipynb")}
    orphans = [p for p in EXERCISES.glob("*.ipynb") if p.name not in known]
    if check and (stale or orphans):
        for path in stale:
            print(f"out of date: {path.relative_to(ROOT)} (run: python tools/make_exercises.py)")
        for path in orphans:
            print(f"no solution notebook for: {path.relative_to(ROOT)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
