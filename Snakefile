# ptspeed: environments -> benchmark cells -> aggregate -> report.
# `snakemake --cores all` runs the default matrix (config/config.yaml); see README.md.
from snakemake.utils import min_version

min_version("9.0")


# A --configfile given on the command line replaces the default matrix instead of being
# merged into it (a merge would keep the default's models and comparisons).
if not workflow.config_settings.configfiles:

    configfile: "config/config.yaml"


report: "report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/envs.smk"
include: "workflow/rules/images.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/reruns.smk"
include: "workflow/rules/report.smk"


from ptspeed.errors import ResultsInUse
from ptspeed.plan.runlock import hold_results_lock


# Snakemake's lock covers its working directory only: a second run on the same results
# directory from another checkout is refused here, before any job starts (not on dry runs).
onstart:
    try:
        hold_results_lock(RESULTS)
    except ResultsInUse as exc:
        raise WorkflowError(str(exc)) from None


rule all:
    default_target: True
    input:
        rules.report.output,
