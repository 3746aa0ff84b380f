# Helpers of workflow/rules/images.smk: how this machine makes the Apptainer images (chosen and
# printed once); what each image is made of is ptspeed.envs.realise.Images.

import functools

from ptspeed.envs.apptainer import SIF_PLAN_VARIABLE, SifPlan, plan_sif
from ptspeed.envs.apptainer_cells import cell_apptainer_args, outside
from ptspeed.envs.container_config import engine_for_images
from ptspeed.envs.containers import ENGINES
from ptspeed.envs.engine_calls import engine_usable
from ptspeed.envs.image_references import is_local_image
from ptspeed.envs.realise import Images

# Each engine is asked once per process (docker's daemon, podman's ID maps: up to 30 s each).
usable_here = functools.cache(engine_usable)


def make_sif_plan():
    """How the Apptainer images are made here; None when no cell runs in one. A cluster job
    takes its main process's plan (apptainer.SIF_PLAN_VARIABLE) and probes nothing."""
    if not (IN_APPTAINER and REALISATION.sif_environments()):
        return None
    with config_errors(""):
        if workflow.remote_exec and os.environ.get(SIF_PLAN_VARIABLE):
            return SifPlan.from_text(os.environ[SIF_PLAN_VARIABLE])
        plan = plan_sif(CONTAINERS, usable_here)
    os.environ[SIF_PLAN_VARIABLE] = plan.to_text()
    if workflow.is_main_process:
        print(f"ptspeed: {plan.describe()}", file=sys.stderr)
    return plan


def images_engine():
    """What builds or pulls the images of the image rule (the plan's engine under Apptainer,
    with no second probe), else container_config.engine_for_images."""
    if SIF_PLAN:
        return SIF_PLAN.engine or ENGINES[0]
    if workflow.remote_exec and CONTAINERS.runtime not in ENGINES:
        return ENGINES[0]  # a cluster job makes no image: nothing to ask
    return engine_for_images(CONTAINERS, usable_here)


def set_cell_apptainer_args():
    """--nv on CUDA runs, whether or not a profile's apptainer-args says it, and binds of the
    results and the sources where the working directory (Snakemake's --home) does not hold
    them; options that isolate the cells from each other are refused."""
    settings = workflow.deployment_settings
    binds = outside(Path.cwd(), [Path(RESULTS), Path(workflow.basedir), *MODEL_PATHS])
    for path in binds:
        path.mkdir(parents=True, exist_ok=True)
    with config_errors():
        settings.apptainer_args = cell_apptainer_args(
            settings.apptainer_args or "", DEVICE_CLASS, binds
        )


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
        with config_errors():
            REALISATION.check_driver({env}, driver)


IMAGES = Images(REALISATION, images_engine(), SIF_PLAN)


def image_requirements(wildcards):
    with config_errors(""):
        return IMAGES.requirements(wildcards.env)


def image_build_options(wildcards):
    return IMAGES.build_options(wildcards.env)


def image_pull_options(wildcards):
    return IMAGES.pull_options(wildcards.env)


def sif_inputs(wildcards):
    with config_errors(""):
        return IMAGES.sif_inputs(wildcards.env)


def sif_options(wildcards):
    with config_errors(""):
        return IMAGES.sif_options(wildcards.env)


def brought_image_input(wildcards):
    """A local image a site brings is its record's input (a replaced file is read again); a
    registry's is pinned by its digest."""
    image = REALISATION.brought(wildcards.env)
    return {"image": image} if image and is_local_image(image) else {}
