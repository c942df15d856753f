"""The benchmark: ``python -m slurmrl.runtime.bench`` runs vLLM's ``vllm bench serve`` once per grid
point (``runner``) and writes the results, their table and plot (``results``)."""
