"""The scheduler and the records it keeps and hands out.

Step records: sequence.py (requests as sequence groups), plan.py (`StepPlan`, `StepOutcome`), preemption.py (the
victim policies), request_queue.py (the waiting queue); beside the plain path beam.py, speculative.py,
failed_step.py (what `abandon_step` undoes) and step_shape.py (what a cost prices). Decisions: scheduler.py.

The records sit below the settings (sim.config) and the scheduler above them (it takes its `SchedulerConfig`
from sim.config), so this package imports nothing of its own: importing a record does not load the scheduler.
"""
