import contextlib
import json
import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from snakemake.exceptions import WorkflowError

sys.path.insert(0, str(Path(workflow.basedir) / "src"))

from ptspeed.plan.cluster import (
    check_cluster,
    check_gpu_limit,
    cpus_per_cell,
    gpu_request,
    slurm_resources,
)
from ptspeed.plan.config import effective_config_json, prepare_config
from ptspeed.plan.device import detect_device_class, device_class_for_jobs
from ptspeed.plan.platforms import cell_job_resources, platform_of, platform_plan
from ptspeed.envs.container_config import check_container_config
from ptspeed.envs.gpu_code import environment_codes, environment_record_path
from ptspeed.envs.realise import Realisation
from ptspeed.launch.gpus import check_variant_gpus
from ptspeed.cell.variants.knobs import parse_knobs
from ptspeed.plan.layout import CELL_PATTERN, RECORD_PATTERN, Cell, wildcard_constraints
from ptspeed.plan.layout import NUMBER, runs_csv_of
from ptspeed.plan.matrix import (
    cell_command_line,
    cells,
    runtime_minutes,
    trial_groups,
    variant_compiles,
)
from ptspeed.cell.provenance import (
    GIT_COMMIT_VARIABLE,
    git_state,
    nvidia_driver_version,
)
from ptspeed.errors import ConfigError


def jobs_go_to_scheduler():
    """Whether cells run as cluster jobs (e.g. --executor slurm). workflow.executor_plugin is
    still None while the Snakefile is parsed (Workflow.execute sets it later), but the command
    line moves --jobs into --cores for a local executor, so in the main process nodes is set
    only for a remote one; inside the cluster job Snakemake runs in remote mode."""
    return workflow.remote_exec or (
        workflow.is_main_process and workflow.resource_settings.nodes is not None
    )


ON_SCHEDULER = jobs_go_to_scheduler()


def device_class(requested):
    """The cells' device class, decided for the nodes they run on (ptspeed.plan.device)."""
    if ON_SCHEDULER:
        return device_class_for_jobs(requested, bool(config.get("platforms")))
    return detect_device_class(requested)


@contextlib.contextmanager
def config_errors(prefix="config: "):
    """A ConfigError raised inside as Snakemake's one-line WorkflowError, ``prefix`` first."""
    try:
        yield
    except ConfigError as exc:
        raise WorkflowError(f"{prefix}{exc}") from None


# Checks the config (schema, paths, cross-references) and fills its defaults in place.
with config_errors():
    SETTINGS = prepare_config(config, device_class, Path.cwd(), workflow.configfiles)

DEVICE_CLASS = SETTINGS.device
RESULTS = SETTINGS.results
ENVIRONMENTS = SETTINGS.environments


def in_apptainer():
    """Whether this run is under --use-singularity / --sdm apptainer."""
    methods = {str(m).lower() for m in workflow.deployment_settings.deployment_method}
    return any("apptainer" in m or "singularity" in m for m in methods)


IN_APPTAINER = in_apptainer()
if workflow.is_main_process:
    with config_errors():
        check_container_config(SETTINGS, IN_APPTAINER)
REALISATION = Realisation(SETTINGS, IN_APPTAINER, Path(workflow.basedir), Path.cwd())
CONTAINERS = REALISATION.containers
# Environments whose record rule build_env writes, and those of images a site brings, whose
# record rule brought_image reads from inside the image. An empty pattern would be no
# constraint at all: with every environment brought, build_env's matches nothing.
BROUGHT_ENVS = REALISATION.brought_environments()
BUILT_ENVS = [env for env in ENVIRONMENTS if env not in BROUGHT_ENVS]
BUILT_ENV_PATTERN = wildcard_constraints(BUILT_ENVS)["env"] or "(?!)"
BROUGHT_ENV_PATTERN = wildcard_constraints(BROUGHT_ENVS)["env"]
ENV_CACHE = REALISATION.env_cache
# A docker or podman image pruned since it was built is built again (its manifest goes).
for notice in REALISATION.forget_pruned_images():
    print(f"ptspeed: {notice}", file=sys.stderr)
# An image has no git to ask: the checkout's commit goes in as a variable of this process,
# which Apptainer passes into the container (a param would rerun every cell after a commit).
if IN_APPTAINER and not os.environ.get(GIT_COMMIT_VARIABLE):
    os.environ[GIT_COMMIT_VARIABLE] = git_state()[0]


def driver_refusals(platforms):
    """Each (platform, environment) whose image needs a newer NVIDIA driver than this node's,
    with the reason: known where Snakemake runs the cells itself (a GPU node). A cluster job
    checks its own environment where it runs (common_images.smk)."""
    if DEVICE_CLASS != "cuda" or not IN_APPTAINER or ON_SCHEDULER:
        return {}
    driver = nvidia_driver_version()
    refused = (
        REALISATION.driver_refusals(SETTINGS.environments, driver) if driver else {}
    )
    return {
        (platform.name, env): reason
        for platform in platforms
        for env, reason in refused.items()
    }


# The cluster's GPU types, and the environments that carry no code for one's GPU or need a
# newer driver than this node's.
with config_errors():
    PLATFORM_PLAN = platform_plan(SETTINGS, environment_codes(SETTINGS, Path.cwd()))
PLATFORM_PLAN = replace(
    PLATFORM_PLAN,
    cannot_run={
        **PLATFORM_PLAN.cannot_run,
        **driver_refusals(PLATFORM_PLAN.platforms),
    },
)
CELLS = list(cells(SETTINGS, PLATFORM_PLAN.cannot_run))
if workflow.is_main_process:
    for reason in PLATFORM_PLAN.cannot_run.values():
        print(f"ptspeed: not planned: {reason}", file=sys.stderr)
# The rules' scripts (workflow/scripts/) import this checkout's sources, as this workflow does,
# whether or not the Python running Snakemake has the project installed.
SCRIPT_SOURCES = shlex.quote(str(Path(workflow.basedir) / "src"))
HOST_PYTHON = f'PYTHONPATH={SCRIPT_SOURCES}"${{PYTHONPATH:+:$PYTHONPATH}}" {shlex.quote(sys.executable)}'


def gpu_limit():
    """The --resources gpu=N of the command line or a profile, None when not given."""
    limit = workflow.resource_settings.resources.get("gpu")
    return getattr(limit, "value", limit)


if workflow.is_main_process:
    with config_errors():
        check_cluster(SETTINGS, ON_SCHEDULER)
    with config_errors(""):
        check_gpu_limit(gpu_limit(), DEVICE_CLASS == "cuda", ON_SCHEDULER)
    if DEVICE_CLASS == "cuda" and not ON_SCHEDULER:
        with config_errors():
            check_variant_gpus(SETTINGS.variants, gpu_limit())


def cell_gpus(wildcards):
    """GPUs a CUDA cell requests (none on the CPU, a constant there): its processes (procs= of
    ddp/fsdp, else 1). Which GPUs it gets on the node is decided by the cell itself
    (ptspeed.launch.gpus): Snakemake only counts."""
    return parse_knobs(SETTINGS.variants[wildcards.variant]).world_size


GRES_TYPES = {platform.name: platform.gres_type for platform in PLATFORM_PLAN.platforms}
GPU_REQUEST_KEYS = ("gpu", "gpu_model", "gres", "slurm_extra")


def cell_gpu_resources():
    """What a cell job asks for its GPUs. On one machine the count alone, which Snakemake sums
    within --resources gpu=N; a cluster job asks SLURM as the site takes it
    (cluster.gpu_request: ptspeed.plan.cluster.gpu_request)."""
    if DEVICE_CLASS != "cuda":
        return {"gpu": 0}
    if not ON_SCHEDULER:
        return {"gpu": cell_gpus}
    for gres_type in GRES_TYPES.values():
        gpu_request(1, gres_type, SETTINGS.cluster.gpu_request)
    return {key: cluster_gpu_request(key) for key in GPU_REQUEST_KEYS}


def cluster_gpu_request(key):
    def value(wildcards):
        gres_type = GRES_TYPES[platform_of(wildcards)]
        how = SETTINGS.cluster.gpu_request
        return gpu_request(cell_gpus(wildcards), gres_type, how)[key]

    return value


# Each cell job on one node (sbatch --nodes=1): a distributed cell's processes talk over the
# node's links, and a job spread over nodes would measure the network instead.
ONE_NODE = {"nodes": 1} if ON_SCHEDULER else {}
with config_errors():
    CELL_JOB_RESOURCES = {
        **cell_job_resources(PLATFORM_PLAN, slurm_resources(SETTINGS.cluster)),
        **cell_gpu_resources(),
        **ONE_NODE,
    }


wildcard_constraints:
    **wildcard_constraints(ENVIRONMENTS, PLATFORM_PLAN.names),


def earlier_runs(wildcards):
    """The runs table of the earlier run the report sets this one against ([]: none)."""
    earlier = SETTINGS.compare.earlier
    return str(runs_csv_of(os.path.expanduser(earlier))) if earlier else []


def record_paths(wildcards):
    """Every record of the matrix, reruns of perturbed trials included. An input function
    rather than a list: Snakemake maps each input file to the item it came from and hashes
    that item per file, which for a 2,000-file list is quadratic (seconds of DAG building).
    """
    return RECORD_PATHS + reruns_before(MAX_RERUNS)


def judged_records(wildcards):
    """What round ``attempt``'s judgement reads: every record of rounds 0 to ``attempt``."""
    return RECORD_PATHS + reruns_before(int(wildcards.attempt))


def reruns_before(attempt):
    """The records of the reruns the judgements of rounds before ``attempt`` asked for; a
    round that asked for none ends the reruns."""
    paths = []
    for earlier in range(attempt):
        listed = checkpoints.judge_trials.get(attempt=earlier).output[0]
        reruns = json.loads(Path(listed).read_text(encoding="utf-8"))["reruns"]
        if not reruns:
            break
        paths.extend(f"{RESULTS}/{path}" for path in reruns)
    return paths


RECORD_PATHS = [f"{RESULTS}/{cell.path}" for cell in CELLS]
# Users' model modules (module:attribute sources) are found in model_paths, after the suite's.
MODEL_PATHS = [Path(os.path.expanduser(p)).resolve() for p in SETTINGS.model_paths]
CELL_PYTHONPATH = os.pathsep.join(
    map(str, [Path(workflow.basedir) / "src", *MODEL_PATHS])
)
MAX_RERUNS = SETTINGS.conditions.reruns


def env_container(wildcards):
    """The cell's `container:`: the environment's Apptainer image, made by this workflow.
    Asked once per job, where the job runs: there its driver is checked."""
    check_job_driver(wildcards.env)
    return REALISATION.container(wildcards.env)


def env_ready_file(wildcards):
    """What a cell waits for: its venv, image manifest, or sif and digest (or nothing)."""
    return REALISATION.ready(wildcards.env)


def other_builds(wildcards):
    """On one machine, the other environments' builds (venvs, images, sifs) before any cell:
    a cell beside a build measures the build too (such trials were judged perturbed and run
    again). ancient(): rebuilding one environment does not rerun another's cells. On a
    cluster the builds run on the login node, apart from the cells: nothing to wait for.
    """
    if ON_SCHEDULER:
        return []
    others = sorted({cell.env for cell in CELLS} - {wildcards.env})
    ready = [REALISATION.ready(env) for env in others]
    paths = [
        path for item in ready for path in ([item] if isinstance(item, str) else item)
    ]
    return [ancient(path) for path in paths]


def env_python(wildcards):
    return REALISATION.python(wildcards.env)


def cell_arguments(wildcards, threads):
    return cell_command_line(SETTINGS, dict(wildcards.items()), threads)


COMPILED_VARIANTS = {v for v in SETTINGS.variants if variant_compiles(SETTINGS, v)}


def first_trial_record(wildcards):
    """A compiled cell's later trials wait for trial 0, so that they find its compiler cache."""
    if wildcards.variant not in COMPILED_VARIANTS or int(wildcards.trial) == 0:
        return []
    return rules.cell.output.record.format(**{**dict(wildcards.items()), "trial": 0})


# On a cluster, trial k of every side of a (platform, model, mode, size) runs as one group job
# on one node, back to back (ptspeed.plan.matrix.trial_groups); reruns run on their own.
TRIAL_GROUPS = trial_groups(CELLS) if ON_SCHEDULER else {}


def trial_group(wildcards):
    """The cell's group job (None: not grouped)."""
    found = TRIAL_GROUPS.get(Cell.from_wildcards(dict(wildcards.items())))
    return found[0] if found else None


def side_before(wildcards):
    """The record of the cell that runs just before this one in its group job ([]: none).
    ancient(): a rerun of that cell does not rerun this one."""
    found = TRIAL_GROUPS.get(Cell.from_wildcards(dict(wildcards.items())))
    if not found or found[1] is None:
        return []
    return ancient(f"{RESULTS}/{found[1].path}")


def cell_settings(wildcards):
    """What a cell measures as configured: its arguments with the thread count left out. A
    params function of the wildcards alone is tracked by Snakemake's params trigger (one that
    takes threads, as cell_arguments does, is not), so a changed knob string, size, step count,
    time limit or threads setting reruns exactly the cells it affects."""
    return f"{cell_arguments(wildcards, 0)} threads={SETTINGS.threads}"


def cell_threads(wildcards):
    gpus = cell_gpus(wildcards) if DEVICE_CLASS == "cuda" else 0
    # Snakemake refuses to tell a cluster run's cores: a job's CPUs are the cluster block's.
    cores = 0 if ON_SCHEDULER else workflow.cores
    return cpus_per_cell(
        SETTINGS.threads, SETTINGS.cluster, ON_SCHEDULER, cores, gpus, gpu_limit()
    )


def cell_cpus(wildcards, threads):
    """sbatch --cpus-per-task of a cell job: its threads (after any --set-threads)."""
    return threads


def trial_priority(wildcards):
    return SETTINGS.trials - int(wildcards.trial)
