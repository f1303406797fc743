"""``python -m dashboards [--check]``: regenerate (or check) the dashboard JSON."""

import sys

from roundgate.dashboards.build import main

sys.exit(main())
