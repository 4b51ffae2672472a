"""``python3 -m sglang.launch_server ARGS``: runs the reference engine (pdd_refengine, a test
double) in SGLang mode. Exists only inside the reference-engine image; see ``__init__.py``."""

import sys

from pdd_refengine.server import main

if __name__ == "__main__":
    sys.exit(main(["sglang", *sys.argv[1:]]))
