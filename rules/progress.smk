# The whole pack's progress on the console (capacity_pack.decide.progress): a plan line when the
# run starts (the Snakefile's onstart), then a line each time a measurement job finishes.
#
# This process prints them, from Snakemake's job-finished log events and its job graph: no rule
# does. A measurement job that counted the pack's points would need the other points in its
# params or inputs (adding a rate would then re-measure every point), or would hash the counting
# code into every measurement; this way no job's params, inputs or code change, nothing is
# written, and a failure here costs a line, never a job.
import logging

from snakemake.logging import logger as snakemake_logger
from snakemake_interface_logger_plugins.common import LogEvent

from capacity_pack.decide import progress as progress_lib


def measurement_jobs():
    """(point, kept, finished) of each measurement job in Snakemake's job graph: kept, a job it
    need not run (its measurement is there)."""
    dag = workflow.dag
    return [
        (wildcard_point(job.wildcards), not dag.needrun(job), dag.finished(job))
        for job in dag.jobs
        if job.rule.name == "sweep"
    ]


def search_rounds_pending():
    """Whether a search round is still to run in this invocation."""
    dag = workflow.dag
    return any(
        job.rule.name == "search_round" and dag.needrun(job) and not dag.finished(job)
        for job in dag.jobs
    )


class MeasurementFinished(logging.Handler):
    """Prints the pack line when Snakemake logs a measurement job as finished."""

    def __init__(self, progress):
        super().__init__(logging.INFO)
        self.progress = progress

    def emit(self, record):
        if getattr(record, "event", None) != LogEvent.JOB_FINISHED:
            return
        try:
            dag = workflow.dag
            job = next(
                (j for j in dag.jobs if j.rule.name == "sweep" and dag.jobid(j) == record.job_id),
                None,
            )
            if job is not None:
                print(self.progress.pack_line(wildcard_point(job.wildcards)), flush=True)
        except Exception:
            # Progress is best effort: a line lost, never the run (logging would print a
            # traceback through handleError).
            pass


def start_pack_progress():
    """Print the plan line and follow the measurement jobs (once, in the invoking process)."""
    try:
        progress = progress_lib.PackProgress(
            PACK,
            measurement_jobs,
            schedule_summary=lambda p: Path(point_output("schedule", "summary", p)),
            sweep_summary=lambda p: Path(point_output("sweep", "summary", p)),
            round_file=lambda cache, k: Path(
                stage_output("search_round", "round", cache=cache, round=k)
            ),
            rounds_pending=search_rounds_pending,
        )
        if not measurement_jobs() and not search_rounds_pending():
            return
        print(progress.plan_line(), flush=True)
        snakemake_logger.addHandler(MeasurementFinished(progress))
    except Exception:
        # Best effort, as each line is: no plan line, never a run that does not start.
        pass
