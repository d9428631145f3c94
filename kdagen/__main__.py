# SPDX-License-Identifier: Apache-2.0
"""Entry point of `python -m kdagen`."""

import sys

from kdagen.cli import main

sys.exit(main())
