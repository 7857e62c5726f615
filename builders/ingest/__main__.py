import sys

from builders.ingest.cli import main

sys.exit(main())
