# Helpers of workflow/rules/images.smk: how this machine makes the Apptainer images (chosen and
# printed once); what each image is made of is ptspeed.envs.realise.Images.

from ptspeed.envs.apptainer import cell_apptainer_args, outside, plan_sif
from ptspeed.envs.containers import engine_for_images, engine_usable
from ptspeed.envs.realise import Images


def make_sif_plan():
    """How the Apptainer images are made here; None when no cell runs in one."""
    if not (IN_APPTAINER and REALISATION.sif_environments()):
        return None
    try:
        plan = plan_sif(CONTAINERS, engine_usable)
    except ConfigError as exc:
        raise WorkflowError(str(exc)) from None
    if workflow.is_main_process:
        print(f"ptspeed: {plan.describe()}", file=sys.stderr)
    return plan


def set_cell_apptainer_args():
    """--nv on CUDA runs, whether or not a profile's apptainer-args says it, and binds of the
    results and the sources where the working directory (Snakemake's --home) does not hold
    them; options that isolate the cells from each other are refused."""
    settings = workflow.deployment_settings
    binds = outside(Path.cwd(), [Path(RESULTS), Path(workflow.basedir), *MODEL_PATHS])
    for path in binds:
        path.mkdir(parents=True, exist_ok=True)
    try:
        settings.apptainer_args = cell_apptainer_args(
            settings.apptainer_args or "", DEVICE_CLASS, binds
        )
    except ConfigError as exc:
        raise WorkflowError(f"config: {exc}") from None


SIF_PLAN = make_sif_plan()
if SIF_PLAN:
    set_cell_apptainer_args()


def check_job_driver(env):
    """In a cluster job, refuse the job's environment (``env``) where its image needs a newer
    driver than the job's node has; the other environments' jobs run. (On a GPU node the main
    process left such cells out before any job: driver_refusals in common.smk.)"""
    if not (SIF_PLAN and DEVICE_CLASS == "cuda" and workflow.remote_exec):
        return
    driver = nvidia_driver_version()
    if driver:
        try:
            REALISATION.check_driver({env}, driver)
        except ConfigError as exc:
            raise WorkflowError(f"config: {exc}") from None


IMAGES = Images(REALISATION, engine_for_images(CONTAINERS, engine_usable), SIF_PLAN)


def image_requirements(wildcards):
    try:
        return IMAGES.requirements(wildcards.env)
    except ConfigError as exc:
        raise WorkflowError(str(exc)) from None


def image_build_options(wildcards):
    return IMAGES.build_options(wildcards.env)


def image_pull_options(wildcards):
    return IMAGES.pull_options(wildcards.env)


def sif_inputs(wildcards):
    try:
        return IMAGES.sif_inputs(wildcards.env)
    except ConfigError as exc:
        raise WorkflowError(str(exc)) from None


def sif_options(wildcards):
    try:
        return IMAGES.sif_options(wildcards.env)
    except ConfigError as exc:
        raise WorkflowError(str(exc)) from None
