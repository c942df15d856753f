import sys

from slurmrl.cli import main

sys.exit(main())
