"""The ranges of recipe and settings numbers that more than one section shares.

Each is chosen from what Slurm, vLLM and the largest clusters really allow; a field's description
states its own range (a test checks the two agree) and docs/recipe-reference.md shows them.
"""

MAX_NODES = 16384  # nodes in one group: the largest Slurm GPU systems have about 10k nodes (Frontier: 9,408)
MAX_GPUS_PER_NODE = 64  # 8 is usual; 8 MI300X in CPX mode show 64, 8 H100 with 7 MIG slices 56
MAX_JOB_GPUS = 131072  # GPUs in one job, every group together: the largest clusters hold about 100k
MAX_CPUS = 4096  # CPUs per node: the largest nodes have 2 x 192 cores x 2 threads = 768
MAX_TOKENS = 2**24  # context and sequence lengths: 16,777,216 tokens (the longest contexts today: 10M)
MAX_STEPS = 10**9  # optimizer steps: 31 years at one step per second
MAX_SEED = 2**32 - 1  # numpy's seed range; the orchestrator derives per-request seeds from it
MAX_SIGNAL_SECONDS = 65535  # sbatch --signal: "sig_time must have an integer value between 0 and 65535"
MAX_DAYS = 365  # slurm.time: partitions' MaxTime is hours to weeks
MAX_MEM_MB = 64 * 2**20  # slurm.mem: 64T per node (the largest nodes have 32T)
INT64 = (-(2**63), 2**63 - 1)  # TOML integers are 64-bit
