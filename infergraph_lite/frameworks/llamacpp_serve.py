"""Moved to :mod:`~infergraph_lite.frameworks.llamacpp.serve` (issue 36: one folder per framework); this path
stays for a parent that still runs ``python -m infergraph_lite.frameworks.llamacpp_serve``.
"""

import sys

from infergraph_lite.frameworks.lazy import forward_names
from infergraph_lite.frameworks.llamacpp.serve import FAILED_STATUS, SHUTDOWN_GRACE, main

__all__ = ["FAILED_STATUS", "SHUTDOWN_GRACE", "main"]

__getattr__ = forward_names(__name__, ["infergraph_lite.frameworks.llamacpp.serve"])  # any other name, on first use

if __name__ == "__main__":
    sys.exit(main(sys.argv))
