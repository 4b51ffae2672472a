import sys

from pdd_node.cli import main

sys.exit(main())
