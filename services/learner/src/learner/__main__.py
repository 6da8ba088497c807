"""``python -m learner``: the learner service (see ``learner.cli``)."""

from __future__ import annotations

import sys

from learner.cli import main

sys.exit(main())
