from slurmrl.plan.model import Plan
from slurmrl.plan.planner import plan

__all__ = ["Plan", "plan"]
