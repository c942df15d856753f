"""Gates: the job's secret in front of every HTTP port a job opens (see ``slurmrl.secret``)."""
