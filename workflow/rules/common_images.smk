# Helpers of workflow/rules/images.smk: what an image is built from, how this machine makes the
# Apptainer images (chosen and printed once), and where they go.

from ptspeed.envs.apptainer import check_driver, default_base_image, plan_sif
from ptspeed.cell.provenance import nvidia_driver_version


def image_environments():
    """Environments that have an image: built from a lock, or pulled by their reference."""
    needed = "requirements" if CONTAINERS["images"] == "build" else "container"
    return [env for env, spec in ENVIRONMENTS.items() if spec.get(needed)]


def apptainer_environments():
    return [
        env for env in ENVIRONMENTS if uses_container(env) and not container_engine(env)
    ]


def make_sif_plan():
    """How the Apptainer images are made here; None when no cell runs in one."""
    if not (IN_APPTAINER and apptainer_environments()):
        return None
    try:
        plan = plan_sif(CONTAINERS, engine_usable)
    except ConfigError as exc:
        raise WorkflowError(str(exc)) from None
    if workflow.is_main_process:
        print(f"ptspeed: {plan.describe()}", file=sys.stderr)
    return plan


def check_node_driver():
    """A CUDA base newer than this node's driver is refused before any cell runs (of the
    environments that the matrix's cells use)."""
    driver = nvidia_driver_version()
    used = {cell.env for cell in CELLS}
    for env in sorted(used & set(apptainer_environments())):
        base = ENVIRONMENTS[env].get("base_image") or default_base_image(
            Path(workflow.basedir)
        )
        try:
            check_driver(env, base, driver)
        except ConfigError as exc:
            raise WorkflowError(f"config: {exc}") from None


def give_cells_the_gpus():
    """--nv on CUDA runs, whether or not a profile's apptainer-args says it."""
    arguments = workflow.deployment_settings.apptainer_args or ""
    if "--nv" not in arguments.split():
        workflow.deployment_settings.apptainer_args = f"{arguments} --nv".strip()


SIF_PLAN = make_sif_plan()
if SIF_PLAN and DEVICE_CLASS == "cuda":
    give_cells_the_gpus()
    if workflow.is_main_process:
        check_node_driver()


def image_requirements(wildcards):
    spec = ENVIRONMENTS[wildcards.env]
    if not spec.get("requirements"):
        raise WorkflowError(
            f"environments.{wildcards.env}: no requirements to build an image from"
        )
    return spec["requirements"]


def image_tag(env):
    """The built image's name: the environment's container reference, else a local name."""
    return ENVIRONMENTS[env].get("container") or f"localhost/ptspeed/{env}:latest"


def quoted(options):
    return " ".join(shlex.quote(str(o)) for o in options)


def recipe_options(env):
    """Command-line options of scripts/image.py that say what an image is built from."""
    spec = ENVIRONMENTS[env]
    options = ["--python", spec["python"]]
    if spec.get("base_image"):
        options += ["--base-image", spec["base_image"]]
    if CONTAINERS["ca_bundle"]:
        options += ["--ca-bundle", Path(CONTAINERS["ca_bundle"]).expanduser().resolve()]
    if CONTAINERS["image_dir"] and SIF_PLAN:
        options += ["--image-dir", Path(CONTAINERS["image_dir"]).expanduser().resolve()]
    return options


def image_build_options(wildcards):
    options = ["--engine", IMAGE_ENGINE, "--tag", image_tag(wildcards.env)]
    if CONTAINERS["push"]:
        options += ["--push-to", CONTAINERS["registry"]]
    return quoted([*options, *recipe_options(wildcards.env)])


def image_pull_options(wildcards):
    return quoted(
        ["--engine", IMAGE_ENGINE, "--uri", ENVIRONMENTS[wildcards.env]["container"]]
    )


def sif_inputs(wildcards):
    """The inputs of the sif rule: the engine's image, or the recipe and lock that
    Apptainer builds itself; a registry image is an input of no rule (pinned by digest).
    """
    if SIF_PLAN is None or SIF_PLAN.source == "registry":
        return {}
    inputs = {
        "requirements": image_requirements(wildcards),
        "install": "docker/install.sh",
        "uv": "docker/uv.txt",
    }
    if SIF_PLAN.source == "image":
        return {**inputs, "manifest": image_manifest(wildcards.env)}
    return {**inputs, "definition": "docker/ptspeed.def"}


def sif_options(wildcards):
    env = wildcards.env
    if SIF_PLAN is None:
        raise WorkflowError(
            f"{sif_path(env)}: made only under --use-singularity / --sdm apptainer"
        )
    options = ["--source", SIF_PLAN.source]
    if SIF_PLAN.source == "registry":
        return quoted([*options, "--uri", ENVIRONMENTS[env]["container"]])
    if SIF_PLAN.source == "image":
        options += ["--engine", SIF_PLAN.engine, "--manifest", image_manifest(env)]
    options += ["--requirements", image_requirements(wildcards)]
    return quoted([*options, *recipe_options(env)])


def images_targets():
    """What `snakemake images` makes: under Apptainer every <env>.sif (with what it is made
    of), else every image."""
    if SIF_PLAN:
        return [sif_path(env) for env in apptainer_environments()]
    return [image_manifest(env) for env in image_environments()]
