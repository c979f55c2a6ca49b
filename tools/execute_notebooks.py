"""Re-execute notebooks top to bottom in a fresh kernel and save them with their outputs.

Each notebook runs in its own folder (as nbval and JupyterLab run it), so the
stored outputs are exactly what a learner and CI see.  Used by ``make notebooks``.

    python tools/execute_notebooks.py notebooks            # every notebook in a folder
    python tools/execute_notebooks.py notebooks/02_dag_executor.ipynb
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent


def relative_tracebacks(nb: nbformat.NotebookNode) -> None:
    """Write tracebacks' file paths relative to the repository, so no machine's paths are stored."""
    prefixes = sorted({str(ROOT) + "/", str(Path(sys.prefix).resolve()) + "/", sys.prefix + "/"}, key=len)[::-1]
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                for prefix in prefixes:
                    output["traceback"] = [line.replace(prefix, "") for line in output["traceback"]]


def execute(path: Path, timeout: int = 120) -> float:
    """Run one notebook in place; return the seconds it took."""
    nb = nbformat.read(path, as_version=4)
    started = time.perf_counter()
    # Cells tagged raises-exception are expected to fail; nbclient honours the tag.
    resources = {"metadata": {"path": str(path.parent)}}  # run in the notebook's folder, as nbval does
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources=resources)
    client.execute()
    elapsed = time.perf_counter() - started
    relative_tracebacks(nb)
    nb.metadata["kernelspec"] = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
    nbformat.write(nb, path)
    return elapsed


def main(args: list[str]) -> None:
    paths = []
    for arg in args or ["notebooks"]:
        p = Path(arg)
        paths += sorted(p.glob("*.ipynb")) if p.is_dir() else [p]
    for path in paths:
        print(f"{path}: {execute(path):.1f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
