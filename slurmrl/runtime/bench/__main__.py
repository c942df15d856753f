import sys

from slurmrl.runtime.bench.runner import main

sys.exit(main())
