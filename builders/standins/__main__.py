"""`python -m builders.standins`: build the stand-ins (builders.standins.cli)."""
import sys

from builders.standins.cli import main

sys.exit(main())
