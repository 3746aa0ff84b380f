import functools
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from ptspeed.envs.apptainer import CELL_PYTHON
from ptspeed.plan.cluster import (
    check_cluster,
    check_gpu_limit,
    cpus_per_cell,
    slurm_resources,
)
from ptspeed.plan.config import prepare_config
from ptspeed.envs.containers import (
    ENGINES,
    check_container_config,
    container_settings,
    engine_for_images,
    engine_usable,
    runs_in_image,
    forget_pruned_image,
)
from ptspeed.envs.venvs import venv_dir
from ptspeed.launch.gpus import check_variant_gpus
from ptspeed.cell.knobs import parse_knobs
from ptspeed.plan.layout import CELL_PATTERN, RECORD_PATTERN, wildcard_constraints
from ptspeed.plan.matrix import (
    cell_command_line,
    cells,
    runtime_minutes,
    variant_compiles,
)
from ptspeed.cell.provenance import GIT_COMMIT_VARIABLE, git_state
from ptspeed.errors import ConfigError


def detect_device_class(requested):
    if requested != "auto":
        return requested
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "cpu"
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
    return "cuda" if listed.returncode == 0 and "GPU" in listed.stdout else "cpu"


# Checks the config (schema, paths, cross-references) and fills its defaults in place.
try:
    DEVICE_CLASS = prepare_config(
        config, detect_device_class, Path.cwd(), workflow.configfiles
    )
except ConfigError as exc:
    raise WorkflowError(f"config: {exc}") from None

RESULTS = config["results"]
ENV_CACHE = Path(config["env_cache"]).expanduser().resolve()
ENVIRONMENTS = config["environments"]
CELLS = list(cells(config, DEVICE_CLASS))
HOST_PYTHON = shlex.quote(sys.executable)


def jobs_go_to_scheduler():
    """Whether cells run as cluster jobs (e.g. --executor slurm). workflow.executor_plugin is
    still None while the Snakefile is parsed (Workflow.execute sets it later), but the command
    line moves --jobs into --cores for a local executor, so in the main process nodes is set
    only for a remote one; inside the cluster job Snakemake runs in remote mode."""
    return workflow.remote_exec or (
        workflow.is_main_process and workflow.resource_settings.nodes is not None
    )


def gpu_limit():
    """The --resources gpu=N of the command line or a profile, None when not given."""
    limit = workflow.resource_settings.resources.get("gpu")
    return getattr(limit, "value", limit)


ON_SCHEDULER = jobs_go_to_scheduler()
if workflow.is_main_process:
    try:
        check_cluster(config["cluster"], ON_SCHEDULER)
    except ConfigError as exc:
        raise WorkflowError(f"config: {exc}") from None
    try:
        check_gpu_limit(gpu_limit(), DEVICE_CLASS == "cuda", ON_SCHEDULER)
    except ConfigError as exc:
        raise WorkflowError(str(exc)) from None
    if DEVICE_CLASS == "cuda" and not ON_SCHEDULER:
        try:
            check_variant_gpus(config["variants"], gpu_limit())
        except ConfigError as exc:
            raise WorkflowError(f"config: {exc}") from None
SLURM_RESOURCES = slurm_resources(config["cluster"])


wildcard_constraints:
    **wildcard_constraints(ENVIRONMENTS),


def record_paths(wildcards):
    """Every record of the matrix. An input function rather than a list: Snakemake maps each
    input file to the item it came from and hashes that item per file, which for a
    2,000-file list is quadratic (seconds of DAG building)."""
    return RECORD_PATHS


RECORD_PATHS = [f"{RESULTS}/{cell.path}" for cell in CELLS]


def in_apptainer():
    """Whether this run is under --use-singularity / --sdm apptainer."""
    methods = {str(m).lower() for m in workflow.deployment_settings.deployment_method}
    return any("apptainer" in m or "singularity" in m for m in methods)


IN_APPTAINER = in_apptainer()
if workflow.is_main_process:
    try:
        check_container_config(config, IN_APPTAINER)
    except ConfigError as exc:
        raise WorkflowError(f"config: {exc}") from None
CONTAINERS = container_settings(config)
IMAGE_ENGINE = engine_for_images(CONTAINERS, engine_usable)
# An image has no git to ask: the checkout's commit goes in as a variable of this process,
# which Apptainer passes into the container (a param would rerun every cell after a commit).
if IN_APPTAINER and not os.environ.get(GIT_COMMIT_VARIABLE):
    os.environ[GIT_COMMIT_VARIABLE] = git_state()[0]


def uses_container(env):
    """Whether the cells of ``env`` run in its image (see ptspeed.envs.containers.runs_in_image)."""
    return runs_in_image(ENVIRONMENTS[env], CONTAINERS, IN_APPTAINER)


def container_engine(env):
    """docker or podman when the cells of ``env`` run in ``docker run`` / ``podman run`` of the
    image the workflow built or pulled (kind container, containers.runtime docker or podman);
    None when they do not (Apptainer, or no container)."""
    if uses_container(env) and CONTAINERS["runtime"] in ENGINES:
        return CONTAINERS["runtime"]
    return None


def image_manifest(env):
    """The manifest of the environment's image, which its cells run (removed first when the
    engine no longer has that image, so that rule image builds it again)."""
    manifest = f"{RESULTS}/images/{env}.json"
    engine = container_engine(env)
    if engine:
        forget_pruned_image_once(manifest, engine)
    return manifest


@functools.cache
def forget_pruned_image_once(manifest, engine):
    notice = forget_pruned_image(Path(manifest), engine)
    if notice:
        print(f"ptspeed: {notice}", file=sys.stderr)


def sif_path(env):
    """The Apptainer image of the environment that rule sif makes and its cells run in."""
    return f"{RESULTS}/images/{env}.sif"


def sif_digest_path(env):
    """The digest of that image (the built or pulled image's), which every record names."""
    return f"{sif_path(env)}.digest"


def env_container(wildcards):
    """The cell's `container:`: the environment's Apptainer image, made by this workflow."""
    env = wildcards.env
    if uses_container(env) and not container_engine(env):
        return sif_path(env)
    return None


def env_venv_dir(env):
    return venv_dir(ENV_CACHE, env, ENVIRONMENTS[env]["requirements"])


def env_ready_file(wildcards):
    """What a cell waits for: its venv (build_env), its image's manifest (docker or podman),
    its Apptainer image and digest (a DAG input: `container:` alone is not one), or nothing
    (host)."""
    env = wildcards.env
    if container_engine(env):
        return image_manifest(env)
    if uses_container(env):
        return [sif_path(env), sif_digest_path(env)]
    if ENVIRONMENTS[env]["kind"] != "venv":
        return []
    return f"{RESULTS}/envs/{env}.json"


def env_python(wildcards):
    return interpreter(wildcards.env)


@functools.cache
def interpreter(env):
    """The shell-quoted Python that runs the cells of ``env``, worked out once per environment
    (it hashes the lock file: 2,000 cells would do that 2,000 times)."""
    engine = container_engine(env)
    if engine:
        return container_launcher(env, engine)
    if uses_container(env):
        return apptainer_python(env)
    if ENVIRONMENTS[env]["kind"] == "host":
        return shlex.quote(sys.executable)
    return shlex.quote(str(Path(env_venv_dir(env)).resolve() / "bin" / "python"))


def apptainer_python(env):
    """The image's python as the cell's command inside the container starts it: blind to the
    host's Python packages (ptspeed.envs.apptainer.CELL_PYTHON), with the digest for the record.
    """
    digest = shlex.quote(sif_digest_path(env))
    return f'{CELL_PYTHON} PTSPEED_CONTAINER_DIGEST="$(cat {digest})" python'


def container_launcher(env, engine):
    """``python`` in ``docker run`` / ``podman run`` of the environment's image: the working
    directory and the results mounted at their own paths, on cuda with the GPUs."""
    here = Path.cwd()
    arguments = [
        sys.executable,
        Path(workflow.basedir) / "scripts" / "container_run.py",
        "--engine",
        engine,
        "--manifest",
        image_manifest(env),
        *(["--gpus"] if DEVICE_CLASS == "cuda" else []),
        "--mount",
        here,
        "--mount",
        Path(RESULTS).resolve(),
        "--workdir",
        here,
        "--",
        "python",
    ]
    return " ".join(shlex.quote(str(a)) for a in arguments)


def cell_arguments(wildcards, threads):
    return cell_command_line(config, dict(wildcards.items()), DEVICE_CLASS, threads)


def first_trial_record(wildcards):
    """A compiled cell's later trials wait for trial 0, so that they find its compiler cache."""
    if not variant_compiles(config, wildcards.variant) or int(wildcards.trial) == 0:
        return []
    return rules.cell.output.record.format(**{**dict(wildcards.items()), "trial": 0})


def cell_settings(wildcards):
    """What a cell measures as configured: its arguments with the thread count left out. A
    params function of the wildcards alone is tracked by Snakemake's params trigger (one that
    takes threads, as cell_arguments does, is not), so a changed knob string, size, step count,
    time limit or threads setting reruns exactly the cells it affects."""
    return f"{cell_arguments(wildcards, 0)} threads={config['threads']}"


def cell_threads():
    return (
        cpus_per_cell(config["threads"], config["cluster"], ON_SCHEDULER)
        or workflow.cores
        or 1
    )


def cell_cpus(wildcards, threads):
    """sbatch --cpus-per-task of a cell job: its threads (after any --set-threads)."""
    return threads


def trial_priority(wildcards):
    return config["trials"] - int(wildcards.trial)


def cell_gpus(wildcards):
    """GPUs a cell requests: its processes (procs= of ddp/fsdp, else 1) on CUDA. Which GPUs
    it gets on the node is decided by the cell itself (ptspeed.launch.gpus): Snakemake only counts.
    """
    if DEVICE_CLASS != "cuda":
        return 0
    return parse_knobs(config["variants"][wildcards.variant]).world_size


def effective_config_json():
    """The config as the cells saw it, with device auto resolved to the class used."""
    return json.dumps(
        {**config, "device": DEVICE_CLASS}
    )  # config order: comparisons as listed
