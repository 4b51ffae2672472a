import sys

from pdd_sidecar.cli import main

sys.exit(main())
