"""`python -m h3batch`: the same as the `h3batch` command."""
import sys

from h3batch.cli import main

sys.exit(main())
