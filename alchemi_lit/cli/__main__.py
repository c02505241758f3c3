"""``python -m alchemi_lit.cli ...``: the same as the ``alchemi-lit`` console script."""

import sys

from . import main

sys.exit(main())
