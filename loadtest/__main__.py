"""`python -m loadtest`: the OpenAI / Triton load generator (see loadtest/cli.py)."""

import sys

from loadtest.cli import main

sys.exit(main())
