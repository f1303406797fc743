"""``python -m dashboards [--check]``: regenerate (or check) the dashboard JSON."""

import sys

from dashboards.build import main

sys.exit(main())
