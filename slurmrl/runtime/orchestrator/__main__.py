import sys

from slurmrl.runtime.orchestrator.loop import main

sys.exit(main())
