"""vLLM: one client for its HTTP routes (``client``), its admin command line (``admin``) and its
own CLI run in process (``cli``). Importing this package does not import vLLM."""
