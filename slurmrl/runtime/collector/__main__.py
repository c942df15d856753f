import sys

from slurmrl.runtime.collector.loop import main

sys.exit(main())
