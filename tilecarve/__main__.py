"""``python3 -m tilecarve``: the same as the ``tilecarve`` console script."""

import sys

from tilecarve.cli import main

sys.exit(main())
