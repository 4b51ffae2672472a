"""``python -m pdd_refengine vllm serve MODEL ...`` or ``python -m pdd_refengine sglang ...``."""

from __future__ import annotations

import sys

from pdd_refengine.server import main

if __name__ == "__main__":
    sys.exit(main())
