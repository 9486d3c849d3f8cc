"""`python -m posttrain ...`: the same command line as the `posttrain` script."""

import sys

from posttrain.cli import main

sys.exit(main())
