"""``python -m benchmarks.sustained run ...`` (see the package docstring)."""

import sys

from benchmarks.sustained.harness import main

sys.exit(main())
