"""Plan -> text: the sbatch script (jinja2 templates, one quoting filter) and the plan summary."""
